package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/inspect"
)

// selection is the dead letters a redrive or purge acts on, chosen from a bounded peek.
type selection struct {
	items   []inspect.DeadLetter
	scan    inspect.Scan
	missing []int64 // --seq numbers not in the dead-letter queue
}

func (s *selection) seqs() []int64 {
	out := make([]int64, len(s.items))
	for i, d := range s.items {
		out[i] = d.SequenceNumber
	}
	return out
}

// selectDeadLetters peeks the dead-letter queue and keeps what the filter selects. Sequence numbers
// given with --seq but absent are reported, not fatal: after a redrive stopped part way, a re-run with
// the same --seq finds the ones it already finished gone.
func (a *app) selectDeadLetters(ctx context.Context, s *session, f inspect.DeadLetterFilter) (*selection, error) {
	list, err := s.inspector.DeadLetters(ctx, f)
	if err != nil {
		return nil, err
	}
	a.warnTruncated(list.Scan)
	sel := &selection{items: list.Items, scan: list.Scan}
	found := make(map[int64]bool, len(list.Items))
	for _, d := range list.Items {
		found[d.SequenceNumber] = true
	}
	for _, n := range f.SequenceNumbers {
		if !found[n] {
			sel.missing = append(sel.missing, n)
		}
	}
	if len(sel.missing) > 0 {
		fmt.Fprintf(a.stderr, "sbretry: warning: %d of the requested sequence numbers are not in %s or do not pass the filters (already redriven or purged?): %v\n",
			len(sel.missing), s.entity.DeadLetterPath(), sel.missing)
	}
	return sel, nil
}

// errRedriveToTopic explains why a subscription's dead letters are never sent to its topic.
var errRedriveToTopic = errors.New("a subscription cannot be sent to, and sending to its topic would deliver the message to every subscription of the topic, not only the one it was dead-lettered from; give --redrive-to QUEUE, a queue that reaches this subscription's consumer only (its forwarding or retry queue)")

// redriveTarget is the queue fresh deliveries go to: the queue itself, or --redrive-to. For a
// subscription --redrive-to is required and must not be the topic.
func redriveTarget(e inspect.Entity, to string) (string, error) {
	if to != "" && strings.Contains(to, "/") {
		return "", usagef("--redrive-to %q must name a queue", to)
	}
	if !e.IsSubscription() {
		if to == "" {
			return e.Queue, nil
		}
		return to, nil
	}
	switch {
	case to == "":
		return "", usagef("redrive from subscription %s: %v", e, errRedriveToTopic)
	case strings.EqualFold(to, e.Topic):
		return "", fmt.Errorf("refusing to redrive to topic %s: %w", e.Topic, errRedriveToTopic)
	}
	return to, nil
}

// dlqRedrive resubmits the selected dead letters as fresh first deliveries: for each, send
// retry.ResubmitMessage, then complete the dead letter (see the package documentation for why this
// order survives a crash).
func (a *app) dlqRedrive(ctx context.Context, args []string) error {
	var c common
	var f filterFlags
	fs := newFlagSet("dlq redrive", &c)
	f.register(fs, true)
	dryRun := fs.Bool("dry-run", false, "")
	to := fs.String("redrive-to", "", "")
	ttl := fs.Duration("ttl", 0, "")
	wait := fs.Duration("wait", defaultReceiveWait, "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("dlq redrive takes no arguments, got %q", pos)
	}
	filter, err := f.filter(a.now(), true)
	if err != nil {
		return err
	}
	if *ttl < 0 || *wait <= 0 {
		return usagef("--ttl must not be negative and --wait must be positive")
	}
	e, err := c.entity()
	if err != nil {
		return err
	}
	target, err := redriveTarget(e, *to)
	if err != nil {
		return err
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	sel, err := a.selectDeadLetters(ctx, s, filter)
	if err != nil {
		return err
	}
	if len(sel.items) == 0 {
		fmt.Fprintf(a.stdout, "nothing to redrive (read %d messages of %s)\n", sel.scan.Peeked, sel.scan.Entity)
		return nil
	}
	if *dryRun {
		fmt.Fprintf(a.stdout, "would resubmit %d dead letters from %s to %s:\n", len(sel.items), s.entity.DeadLetterPath(), target)
		for _, d := range sel.items {
			fresh := retry.ResubmitMessage(d.Message, *ttl)
			fmt.Fprintf(a.stdout, "  %d %s (%s) as %s\n", d.SequenceNumber, d.MessageID, d.Reason, *fresh.MessageID)
		}
		return nil
	}
	sender, err := s.client.NewSender(target, nil)
	if err != nil {
		return fmt.Errorf("opening a sender on %s: %w", target, err)
	}
	defer closeLink(ctx, sender)
	// The order is the crash contract: the fresh delivery first, the complete second. A crash between
	// the two leaves the dead letter in place; the re-run sends the same MessageID (ResubmitMessage
	// derives it from the dead letter's sequence number and MessageID), which duplicate detection drops,
	// and completes it. The opposite order could lose the message.
	n := 0
	done, err := a.drainSelected(ctx, s, sel, *wait, "redrive", func(ctx context.Context, r dlqReceiver, m *azservicebus.ReceivedMessage) error {
		if err := sender.SendMessage(ctx, retry.ResubmitMessage(m, *ttl), nil); err != nil {
			return fmt.Errorf("sending to %s: %w", target, err)
		}
		n++
		if a.hooks.afterResubmit != nil {
			a.hooks.afterResubmit(n, *m.SequenceNumber)
		}
		if err := r.CompleteMessage(ctx, m, nil); err != nil {
			return fmt.Errorf("sent to %s, but completing the dead letter failed (a re-run resends the same MessageID, which duplicate detection drops): %w", target, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redrive stopped after %d of %d: %w; run the same command again to finish", done, len(sel.items), err)
	}
	fmt.Fprintf(a.stdout, "resubmitted %d dead letters from %s to %s\n", done, s.entity.DeadLetterPath(), target)
	return nil
}

// drainSelected receives the dead-letter queue in peek-lock mode and hands each selected dead letter
// to each, with progress on stderr. Selected dead letters that never arrive are checked with a peek:
// gone is fine (someone else took them), still there (locked elsewhere) is an error.
func (a *app) drainSelected(ctx context.Context, s *session, sel *selection, wait time.Duration, verb string,
	each func(ctx context.Context, r dlqReceiver, m *azservicebus.ReceivedMessage) error) (int, error) {
	var r *azservicebus.Receiver
	var err error
	opts := &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter, ReceiveMode: azservicebus.ReceiveModePeekLock}
	if s.entity.IsSubscription() {
		r, err = s.client.NewReceiverForSubscription(s.entity.Topic, s.entity.Subscription, opts)
	} else {
		r, err = s.client.NewReceiverForQueue(s.entity.Queue, opts)
	}
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", s.entity.DeadLetterPath(), err)
	}
	defer closeLink(ctx, r)
	p := newProgress(a.stderr, verb, len(sel.items))
	// The selection came from the first scan.Peeked messages in sequence order, which is also the order
	// they are received in, so no more than that many others can come first.
	holdLimit := sel.scan.Peeked + 1
	done, missing, err := drain(ctx, r, sel.seqs(), wait, holdLimit, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		return each(ctx, r, m)
	}, p.update)
	p.stop(done)
	if err != nil {
		return done, err
	}
	var stuck []int64
	for _, seq := range missing {
		if _, perr := s.inspector.DeadLetter(ctx, seq); perr == nil {
			stuck = append(stuck, seq)
		} else if !errors.Is(perr, inspect.ErrNotFound) {
			return done, perr
		}
	}
	if gone := len(missing) - len(stuck); gone > 0 {
		fmt.Fprintf(a.stderr, "sbretry: warning: %d selected dead letters left the queue meanwhile (another redrive or purge?)\n", gone)
	}
	if len(stuck) > 0 {
		return done, fmt.Errorf("%d selected dead letters were not received within --wait %v, probably locked by another receiver: %v", len(stuck), wait, stuck)
	}
	return done, nil
}

// closeLink closes a link, bounded even when ctx is done.
func closeLink(ctx context.Context, l interface{ Close(context.Context) error }) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	_ = l.Close(cctx)
}
