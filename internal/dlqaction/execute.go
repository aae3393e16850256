package dlqaction

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/inspect"
)

// DefaultWait is [Options.Wait] when zero.
const DefaultWait = 5 * time.Second

// Options tunes [Execute]. The zero value is every default.
type Options struct {
	// Wait is how long one receive waits for a message before the planned dead letters not received
	// are looked up with a peek: gone is a warning, still there (locked elsewhere) an error. Zero means
	// [DefaultWait]; negative is invalid.
	Wait time.Duration
	// WaitName and PeekLimitName name the settings behind Wait and the inspector's MaxPeek in error
	// messages, so that they tell the operator what to change ("--wait", "--max-peek"). Empty means
	// "the receive wait" and "the peek limit".
	WaitName, PeekLimitName string
	// Progress, when set, is called with the number of items done after each one.
	Progress func(done int)
	// Warn, when set, receives warnings that do not stop the action (planned dead letters that left
	// their queue meanwhile).
	Warn func(msg string)
	// AfterResubmit, when set, runs in a redrive after the n-th fresh delivery was sent and before its
	// dead letter is completed; tests stop there the way a crash would.
	AfterResubmit func(n int, seq int64)
}

func (o Options) withDefaults() (Options, error) {
	if o.Wait < 0 {
		return o, fmt.Errorf("dlqaction: Wait %v is negative", o.Wait)
	}
	if o.Wait == 0 {
		o.Wait = DefaultWait
	}
	if o.WaitName == "" {
		o.WaitName = "the receive wait"
	}
	if o.PeekLimitName == "" {
		o.PeekLimitName = "the peek limit"
	}
	if o.Progress == nil {
		o.Progress = func(int) {}
	}
	if o.Warn == nil {
		o.Warn = func(string) {}
	}
	return o, nil
}

// Execute carries out p through client, checking leftovers with in (the inspector p was selected
// with), and returns how many items it did; each done item has Done set. Every receive, send, complete
// and abandon is reported to in's [inspect.Observer], when it has one. It works through the plan one
// dead-letter queue at a time, so that every dead letter is settled in the queue it was selected in,
// and stops at the first error, leaving the rest for a re-run. See the package documentation for the
// order of a redrive's send and complete.
func Execute(ctx context.Context, client *azservicebus.Client, in *inspect.Inspector, p *Plan, opts *Options) (int, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o, err := o.withDefaults()
	if err != nil {
		return 0, err
	}
	var each func(ctx context.Context, r Receiver, it *Item, m *azservicebus.ReceivedMessage) error
	switch p.Action {
	case Purge:
		each = func(ctx context.Context, r Receiver, it *Item, m *azservicebus.ReceivedMessage) error {
			if err := checkPlanned(it, m); err != nil {
				return err
			}
			return r.CompleteMessage(ctx, m, nil)
		}
	case Redrive:
		if p.Target == "" {
			return 0, fmt.Errorf("dlqaction: a redrive plan without a target")
		}
		if err := p.checkResubmitIDs(); err != nil {
			return 0, err
		}
		sender, err := client.NewSender(p.Target, nil)
		if err != nil {
			return 0, fmt.Errorf("opening a sender on %s: %w", p.Target, err)
		}
		defer closeLink(ctx, sender)
		each = redriveEach(sender, in.Observer(), p, o)
	default:
		return 0, fmt.Errorf("dlqaction: unknown action %q", p.Action)
	}
	return drainPlan(ctx, client, in, p, o, each)
}

// redriveEach resubmits one dead letter, then completes it. The order is the crash contract: the
// fresh delivery first, the complete second. A crash between the two leaves the dead letter in place;
// the re-run sends the same MessageID (ResubmitMessage derives it from the dead letter's sequence
// number and MessageID), which duplicate detection drops, and completes it. The opposite order could
// lose the message.
func redriveEach(sender *azservicebus.Sender, obs inspect.Observer, p *Plan, o Options) func(ctx context.Context, r Receiver, it *Item, m *azservicebus.ReceivedMessage) error {
	sent := 0
	return func(ctx context.Context, r Receiver, it *Item, m *azservicebus.ReceivedMessage) error {
		if err := checkPlanned(it, m); err != nil {
			return err
		}
		fresh := envelope.Resubmit(m, p.TTL, time.Now())
		if *fresh.MessageID != it.ResubmitID {
			return fmt.Errorf("%w: %s would be resubmitted as %s, the preview showed %s; nothing was sent", ErrChanged, it.Ref(), *fresh.MessageID, it.ResubmitID)
		}
		send := inspect.Call{Operation: inspect.OpSend, Entity: p.Target, MessageID: *fresh.MessageID, Properties: fresh.ApplicationProperties}
		if err := inspect.Observe(ctx, obs, send, func(ctx context.Context) (int, error) {
			return 0, sender.SendMessage(ctx, fresh, nil)
		}); err != nil {
			return fmt.Errorf("sending to %s: %w", p.Target, err)
		}
		it.Sent = true
		sent++
		if o.AfterResubmit != nil {
			o.AfterResubmit(sent, *m.SequenceNumber)
		}
		if err := r.CompleteMessage(ctx, m, nil); err != nil {
			return fmt.Errorf("sent to %s, but completing the dead letter failed (a re-run resends the same MessageID, which duplicate detection drops): %w", p.Target, err)
		}
		return nil
	}
}

// drainPlan receives each dead-letter queue of the plan in peek-lock mode and hands each planned dead
// letter received there to each. Planned dead letters that never arrive are checked with a peek.
func drainPlan(ctx context.Context, client *azservicebus.Client, in *inspect.Inspector, p *Plan, o Options,
	each func(ctx context.Context, r Receiver, it *Item, m *azservicebus.ReceivedMessage) error) (int, error) {
	for _, entity := range p.Entities() {
		items := make(map[int64]*Item)
		var seqs []int64
		for _, it := range p.Items {
			if it.DeadLetter.Entity == entity {
				items[it.DeadLetter.SequenceNumber] = it
				seqs = append(seqs, it.DeadLetter.SequenceNumber)
			}
		}
		raw, err := OpenDeadLetterReceiver(client, entity)
		if err != nil {
			return p.Done(), err
		}
		r := observeReceiver(raw, in.Observer(), entity)
		holdLimit, ok := p.holdLimits[entity]
		if !ok {
			holdLimit = len(seqs) + 1
		}
		_, missing, left, err := drain(ctx, r, seqs, o.Wait, holdLimit, o.PeekLimitName, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			it := items[*m.SequenceNumber]
			if err := each(ctx, r, it, m); err != nil {
				return err
			}
			it.Done = true
			return nil
		}, func(int) { o.Progress(p.Done()) })
		closeLink(ctx, raw)
		if gerr := giveBack(ctx, client, in.Observer(), entity, left); gerr != nil {
			o.Warn(gerr.Error())
		}
		if err != nil {
			return p.Done(), fmt.Errorf("%s: %w", entity, err)
		}
		if err := checkMissing(ctx, in, entity, missing, o); err != nil {
			return p.Done(), err
		}
	}
	return p.Done(), nil
}

// checkMissing peeks the planned dead letters of entity that were not received: gone is a warning,
// still there is an error.
func checkMissing(ctx context.Context, in *inspect.Inspector, entity string, missing []int64, o Options) error {
	var stuck, gone []inspect.Ref
	for _, seq := range missing {
		ref := inspect.Ref{Entity: entity, SequenceNumber: seq}
		if _, err := in.DeadLetter(ctx, ref); err == nil {
			stuck = append(stuck, ref)
		} else if errors.Is(err, inspect.ErrNotFound) {
			gone = append(gone, ref)
		} else {
			return err
		}
	}
	if len(gone) > 0 {
		o.Warn(fmt.Sprintf("%d selected dead letters left %s meanwhile (another redrive or purge?): %s", len(gone), entity, JoinRefs(gone)))
	}
	if len(stuck) > 0 {
		return fmt.Errorf("%d selected dead letters were not received within %s %v, probably locked by another receiver: %s", len(stuck), o.WaitName, o.Wait, JoinRefs(stuck))
	}
	return nil
}

// deadLetterSuffix ends the path of a dead-letter queue.
const deadLetterSuffix = "/$DeadLetterQueue"

// OpenDeadLetterReceiver opens a peek-lock receiver on the dead-letter queue at path, as the
// inspector spells it ("billing-retry/$DeadLetterQueue", "events/Subscriptions/billing/$DeadLetterQueue").
func OpenDeadLetterReceiver(client *azservicebus.Client, path string) (*azservicebus.Receiver, error) {
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

// closeLink closes a link, bounded even when ctx is done.
func closeLink(ctx context.Context, l interface{ Close(context.Context) error }) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	_ = l.Close(cctx)
}
