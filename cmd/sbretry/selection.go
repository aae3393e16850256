package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/inspect"
)

// selection is the dead letters a redrive or purge acts on, chosen from a bounded peek of every
// dead-letter queue of the entity. Each item is addressed by its dead-letter queue and its sequence
// number there (inspect.Ref): the two dead-letter queues of a subscription layout count sequence
// numbers each on their own, so a number alone could name a dead letter in either.
type selection struct {
	items   []inspect.DeadLetter
	scans   []inspect.Scan
	missing []inspect.Ref // refs given with --seq that are not in their dead-letter queue
}

// selectDeadLetters peeks the dead-letter queues and keeps what the filter selects. Refs given with
// --seq but absent are reported, not fatal: after a redrive stopped part way, a re-run with the same
// --seq finds the ones it already finished gone.
func (a *app) selectDeadLetters(ctx context.Context, s *session, f inspect.DeadLetterFilter) (*selection, error) {
	list, err := s.inspector.DeadLetters(ctx, f)
	if err != nil {
		return nil, err
	}
	sel := &selection{items: list.Items, scans: list.Scans(), missing: list.Missing}
	a.warnTruncated(sel.scans...)
	if len(sel.missing) > 0 {
		fmt.Fprintf(a.stderr, "sbretry: warning: %d of the requested dead letters are not in their dead-letter queue or do not pass the filters (already redriven or purged?): %s\n",
			len(sel.missing), joinRefs(sel.missing))
	}
	return sel, nil
}

// byEntity groups the selection by dead-letter queue, in the order the queues were read.
func (s *selection) byEntity() [][]inspect.DeadLetter {
	var out [][]inspect.DeadLetter
	for _, sc := range s.scans {
		var group []inspect.DeadLetter
		for _, d := range s.items {
			if d.Entity == sc.Entity {
				group = append(group, d)
			}
		}
		if len(group) > 0 {
			out = append(out, group)
		}
	}
	return out
}

// scanOf is the scan of the dead-letter queue entity.
func (s *selection) scanOf(entity string) inspect.Scan {
	for _, sc := range s.scans {
		if sc.Entity == entity {
			return sc
		}
	}
	return inspect.Scan{Entity: entity}
}

// planItem is one line of the preview of a redrive or purge: the dead letter as selected, and for a
// redrive the MessageID its fresh delivery will carry. The dry run prints the plan and stops; the real
// run prints the same plan, then carries out exactly that, refusing a dead letter that no longer
// matches its line.
type planItem struct {
	dead       inspect.DeadLetter
	resubmitID string // redrive only
	done       bool
}

func (p planItem) ref() inspect.Ref { return p.dead.Ref() }

// printPlan writes the plan as a table, one dead letter a line, named by entity and sequence number.
func printPlan(w io.Writer, items []*planItem, redrive bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "  ENTITY\tSEQ\tREASON\tORIGINAL ID\tMESSAGE ID"
	if redrive {
		head += "\tRESUBMIT AS"
	}
	fmt.Fprintln(tw, head)
	for _, it := range items {
		d := it.dead
		line := fmt.Sprintf("  %s\t%d\t%s\t%s\t%s", d.Entity, d.SequenceNumber, d.Reason, clip(d.OriginalMessageID(), 60), d.MessageID)
		if redrive {
			line += "\t" + it.resubmitID
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// errChanged is returned for a received dead letter that does not match the line of the plan it was
// selected by: the real run acts on exactly what the preview showed, or not at all.
var errChanged = errors.New("the dead letter received is not the one previewed")

// checkPlanned refuses a received dead letter whose MessageID differs from the plan's.
func checkPlanned(it *planItem, m *azservicebus.ReceivedMessage) error {
	if m.MessageID != it.dead.MessageID {
		return fmt.Errorf("%w: %s has MessageID %q, the preview showed %q; nothing was done with it", errChanged, it.ref(), m.MessageID, it.dead.MessageID)
	}
	return nil
}

// drainSelected works through the plan one dead-letter queue at a time: it receives that queue in
// peek-lock mode and hands each planned dead letter received there to each, with progress on stderr,
// so that every dead letter is settled in the queue it was selected in. Planned dead letters that
// never arrive are checked with a peek: gone is fine (someone else took them), still there (locked
// elsewhere) is an error. It returns how many were handed to each without an error.
func (a *app) drainSelected(ctx context.Context, s *session, sel *selection, plan []*planItem, wait time.Duration, verb string,
	each func(ctx context.Context, r dlqReceiver, it *planItem, m *azservicebus.ReceivedMessage) error) (int, error) {
	p := newProgress(a.stderr, verb, len(plan))
	defer func() { p.stop(countDone(plan)) }()
	for _, entity := range planEntities(plan) {
		items := make(map[int64]*planItem)
		var seqs []int64
		for _, it := range plan {
			if it.dead.Entity == entity {
				items[it.dead.SequenceNumber] = it
				seqs = append(seqs, it.dead.SequenceNumber)
			}
		}
		r, err := openDeadLetterReceiver(s.client, entity)
		if err != nil {
			return countDone(plan), err
		}
		// The selection came from the first scan.Peeked messages of this queue in sequence order,
		// which is also the order they are received in, so no more than that many others come first.
		holdLimit := sel.scanOf(entity).Peeked + 1
		_, missing, err := drain(ctx, r, seqs, wait, holdLimit, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			it := items[*m.SequenceNumber]
			if err := each(ctx, r, it, m); err != nil {
				return err
			}
			it.done = true
			return nil
		}, func(int) { p.update(countDone(plan)) })
		closeLink(ctx, r)
		if err != nil {
			return countDone(plan), fmt.Errorf("%s: %w", entity, err)
		}
		if err := a.checkMissing(ctx, s, entity, missing, wait); err != nil {
			return countDone(plan), err
		}
	}
	return countDone(plan), nil
}

// checkMissing peeks the planned dead letters of entity that were not received: gone is a warning,
// still there is an error.
func (a *app) checkMissing(ctx context.Context, s *session, entity string, missing []int64, wait time.Duration) error {
	var stuck, gone []inspect.Ref
	for _, seq := range missing {
		ref := inspect.Ref{Entity: entity, SequenceNumber: seq}
		if _, err := s.inspector.DeadLetter(ctx, ref); err == nil {
			stuck = append(stuck, ref)
		} else if errors.Is(err, inspect.ErrNotFound) {
			gone = append(gone, ref)
		} else {
			return err
		}
	}
	if len(gone) > 0 {
		fmt.Fprintf(a.stderr, "sbretry: warning: %d selected dead letters left %s meanwhile (another redrive or purge?): %s\n", len(gone), entity, joinRefs(gone))
	}
	if len(stuck) > 0 {
		return fmt.Errorf("%d selected dead letters were not received within --wait %v, probably locked by another receiver: %s", len(stuck), wait, joinRefs(stuck))
	}
	return nil
}

// planEntities are the dead-letter queues of the plan, in plan order.
func planEntities(plan []*planItem) []string {
	var out []string
	for _, it := range plan {
		if !slices.Contains(out, it.dead.Entity) {
			out = append(out, it.dead.Entity)
		}
	}
	return out
}

func countDone(plan []*planItem) int {
	n := 0
	for _, it := range plan {
		if it.done {
			n++
		}
	}
	return n
}

// deadLetterSuffix ends the path of a dead-letter queue.
const deadLetterSuffix = "/$DeadLetterQueue"

// openDeadLetterReceiver opens a peek-lock receiver on the dead-letter queue at path, as the
// inspector spells it ("billing-retry/$DeadLetterQueue", "events/Subscriptions/billing/$DeadLetterQueue").
func openDeadLetterReceiver(client *azservicebus.Client, path string) (*azservicebus.Receiver, error) {
	owner, ok := strings.CutSuffix(path, deadLetterSuffix)
	if !ok {
		return nil, fmt.Errorf("%s is not a dead-letter queue", path)
	}
	e, err := inspect.ParseEntity(owner)
	if err != nil {
		return nil, err
	}
	opts := &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter, ReceiveMode: azservicebus.ReceiveModePeekLock}
	var r *azservicebus.Receiver
	if e.IsSubscription() {
		r, err = client.NewReceiverForSubscription(e.Topic, e.Subscription, opts)
	} else {
		r, err = client.NewReceiverForQueue(e.Queue, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	return r, nil
}

// joinRefs lists refs as ENTITY:SEQ, the form --seq and the other commands take.
func joinRefs(refs []inspect.Ref) string {
	s := make([]string, len(refs))
	for i, r := range refs {
		s[i] = r.String()
	}
	return strings.Join(s, ", ")
}

// closeLink closes a link, bounded even when ctx is done.
func closeLink(ctx context.Context, l interface{ Close(context.Context) error }) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	_ = l.Close(cctx)
}
