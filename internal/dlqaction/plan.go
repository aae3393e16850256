package dlqaction

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/inspect"
)

// Action names what a [Plan] does with its dead letters.
type Action string

// The actions on dead letters.
const (
	// Redrive resubmits each dead letter as a fresh first delivery, then completes it.
	Redrive Action = "redrive"
	// Purge completes (deletes) each dead letter.
	Purge Action = "purge"
)

// Selection is the dead letters an action acts on, chosen from a bounded peek of every dead-letter
// queue the inspector reads.
type Selection struct {
	// Items are the selected dead letters, in the order they were read.
	Items []inspect.DeadLetter
	// Scans says what was read from each dead-letter queue, in the order they were read.
	Scans []inspect.Scan
	// Missing are the refs of the filter that are not in their dead-letter queue among the messages
	// read, or do not pass the filter's other fields (already redriven or purged, say).
	Missing []inspect.Ref
	// Unaddressable are dead letters the filter selected that came back without a sequence number:
	// nothing can name them, so no action takes them. Service Bus always sets one; this guards against
	// a broker that does not.
	Unaddressable []inspect.DeadLetter
}

// Select peeks the dead-letter queues of in and keeps what f selects. Refs of f that are absent are
// reported in Missing, not as an error: after an action stopped part way, a re-run with the same refs
// finds the ones it already finished gone.
func Select(ctx context.Context, in *inspect.Inspector, f inspect.DeadLetterFilter) (*Selection, error) {
	list, err := in.DeadLetters(ctx, f)
	if err != nil {
		return nil, err
	}
	sel := &Selection{Scans: list.Scans(), Missing: list.Missing}
	for _, d := range list.Items {
		if d.SequenceNumber < 0 {
			sel.Unaddressable = append(sel.Unaddressable, d)
			continue
		}
		sel.Items = append(sel.Items, d)
	}
	return sel, nil
}

// scanOf is the scan of the dead-letter queue entity.
func (s *Selection) scanOf(entity string) inspect.Scan {
	for _, sc := range s.Scans {
		if sc.Entity == entity {
			return sc
		}
	}
	return inspect.Scan{Entity: entity}
}

// Item is one line of a plan: the dead letter as selected, for a redrive the MessageID its fresh
// delivery will carry, and whether it was done.
type Item struct {
	// DeadLetter is the dead letter as the selection peeked it.
	DeadLetter inspect.DeadLetter
	// ResubmitID is the MessageID of the fresh delivery (redrive only).
	ResubmitID string
	// Sent is set once a redrive sent the fresh delivery; Done may still be false then, when the
	// complete that follows failed (a re-run sends the same MessageID, which duplicate detection drops).
	Sent bool
	// Done is set once the dead letter was settled by [Execute].
	Done bool
}

// Ref addresses the item's dead letter.
func (it *Item) Ref() inspect.Ref { return it.DeadLetter.Ref() }

// Plan is the preview of a redrive or purge and, once executed, its report. The dry run shows the plan
// and stops; the real run shows the same plan and carries out exactly that.
type Plan struct {
	// Action is what the plan does.
	Action Action
	// Target is the queue a redrive sends to; empty for a purge.
	Target string
	// TTL is the time to live of a redrive's fresh deliveries; zero keeps the entity's default.
	TTL time.Duration
	// Items are the dead letters, in selection order.
	Items []*Item
	// Scans and Missing are the selection's.
	Scans   []inspect.Scan
	Missing []inspect.Ref
	// holdLimits bounds, per dead-letter queue, the messages a drain may hold before the planned ones.
	holdLimits map[string]int
}

// NewRedrivePlan plans resubmitting the selection to target with ttl (zero: the target's default).
// Each item's ResubmitID is the MessageID [Execute] will send, derived from the dead letter, so the
// preview shows the real run's ids.
func NewRedrivePlan(sel *Selection, target string, ttl time.Duration) *Plan {
	p := newPlan(Redrive, sel)
	p.Target, p.TTL = target, ttl
	for _, it := range p.Items {
		it.ResubmitID = *retry.ResubmitMessage(it.DeadLetter.Message, ttl, time.Now()).MessageID // the id does not depend on the time
	}
	return p
}

// NewPurgePlan plans deleting the selection.
func NewPurgePlan(sel *Selection) *Plan { return newPlan(Purge, sel) }

func newPlan(a Action, sel *Selection) *Plan {
	p := &Plan{Action: a, Scans: sel.Scans, Missing: sel.Missing, Items: make([]*Item, len(sel.Items)), holdLimits: map[string]int{}}
	for i, d := range sel.Items {
		p.Items[i] = &Item{DeadLetter: d}
	}
	for _, sc := range sel.Scans {
		// The selection came from the first sc.Peeked messages of this queue in sequence order, which
		// is also the order they are received in, so no more than that many others come first.
		p.holdLimits[sc.Entity] = sc.Peeked + 1
	}
	return p
}

// Done counts the items done.
func (p *Plan) Done() int {
	n := 0
	for _, it := range p.Items {
		if it.Done {
			n++
		}
	}
	return n
}

// Refs are the refs of the plan's items, in plan order.
func (p *Plan) Refs() []inspect.Ref {
	out := make([]inspect.Ref, len(p.Items))
	for i, it := range p.Items {
		out[i] = it.Ref()
	}
	return out
}

// Entities are the dead-letter queues of the plan, in plan order.
func (p *Plan) Entities() []string {
	var out []string
	for _, it := range p.Items {
		if !slices.Contains(out, it.DeadLetter.Entity) {
			out = append(out, it.DeadLetter.Entity)
		}
	}
	return out
}

// ErrDuplicateResubmit is returned by [Execute] for a redrive plan in which two dead letters would be
// resubmitted with the same MessageID (the same sequence number and MessageID in two dead-letter
// queues): duplicate detection would drop the second send while its dead letter was completed.
var ErrDuplicateResubmit = errors.New("two dead letters of the plan would be resubmitted with the same MessageID")

// checkResubmitIDs refuses a redrive plan whose fresh deliveries would share a MessageID.
func (p *Plan) checkResubmitIDs() error {
	seen := make(map[string]inspect.Ref, len(p.Items))
	for _, it := range p.Items {
		if other, dup := seen[it.ResubmitID]; dup {
			return fmt.Errorf("%w: %s and %s (%s); redrive them one at a time, each after the other's duplicate-detection window", ErrDuplicateResubmit, other, it.Ref(), it.ResubmitID)
		}
		seen[it.ResubmitID] = it.Ref()
	}
	return nil
}

// ErrChanged is returned for a received dead letter that does not match the line of the plan it was
// selected by: an action does exactly what its preview showed, or nothing with that dead letter.
var ErrChanged = errors.New("the dead letter received is not the one previewed")

// checkPlanned refuses a received dead letter whose MessageID differs from the plan's.
func checkPlanned(it *Item, m *azservicebus.ReceivedMessage) error {
	if m.MessageID != it.DeadLetter.MessageID {
		return fmt.Errorf("%w: %s has MessageID %q, the preview showed %q; nothing was done with it", ErrChanged, it.Ref(), m.MessageID, it.DeadLetter.MessageID)
	}
	return nil
}

// ErrRedriveToTopic explains why a subscription's dead letters are never sent to its topic.
var ErrRedriveToTopic = errors.New("a subscription cannot be sent to, and sending to its topic would deliver the message to every subscription of the topic, not only the one it was dead-lettered from; give --redrive-to QUEUE, a queue that reaches this subscription's consumer only (a queue forwarding to it, or its consumer's retry queue)")

// ErrInvalidTarget is returned by [Target] for a redrive target it cannot use.
var ErrInvalidTarget = errors.New("invalid redrive target")

// Target is the queue a redrive of e's dead letters sends to: to when given, else the queue itself.
// A subscription has no default (errors wrap [ErrRedriveToTopic]), its topic is refused (the same),
// and to must name a queue ([ErrInvalidTarget]).
func Target(e inspect.Entity, to string) (string, error) {
	if to != "" && strings.Contains(to, "/") {
		return "", fmt.Errorf("%w: --redrive-to %q must name a queue", ErrInvalidTarget, to)
	}
	if !e.IsSubscription() {
		if to == "" {
			return e.Queue, nil
		}
		return to, nil
	}
	switch {
	case to == "":
		return "", fmt.Errorf("redrive from subscription %s: %w", e, ErrRedriveToTopic)
	case strings.EqualFold(to, e.Topic):
		return "", fmt.Errorf("refusing to redrive to topic %s: %w", e.Topic, ErrRedriveToTopic)
	}
	return to, nil
}

// JoinRefs lists refs as ENTITY:SEQ, the form the operator tools take.
func JoinRefs(refs []inspect.Ref) string {
	s := make([]string, len(refs))
	for i, r := range refs {
		s[i] = r.String()
	}
	return strings.Join(s, ", ")
}
