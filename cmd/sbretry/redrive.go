package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/inspect"
)

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
// retry.ResubmitMessage, then complete the dead letter in its own dead-letter queue (see the package
// documentation for why this order survives a crash). The dry run prints the plan the real run prints
// and carries out: the same dead letters, by entity and sequence number, and the same MessageIDs.
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
	plan := make([]*planItem, len(sel.items))
	for i, d := range sel.items {
		plan[i] = &planItem{dead: d, resubmitID: *retry.ResubmitMessage(d.Message, *ttl).MessageID}
	}
	rep := &actionReport{action: "redrive", dryRun: *dryRun, target: target, plan: plan, missing: sel.missing}
	if len(plan) == 0 {
		return a.finish(c.json, rep, nil, fmt.Sprintf("nothing to redrive (read %s)", describeScans(sel.scans)))
	}
	if !c.json {
		verb := "resubmitting"
		if *dryRun {
			verb = "would resubmit"
		}
		fmt.Fprintf(a.stdout, "%s %d dead letters to %s:\n", verb, len(plan), target)
		if err := printPlan(a.stdout, plan, true); err != nil {
			return err
		}
	}
	if *dryRun {
		return a.finish(c.json, rep, nil, "")
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
	sent := 0
	done, err := a.drainSelected(ctx, s, sel, plan, *wait, "redrive", func(ctx context.Context, r dlqReceiver, it *planItem, m *azservicebus.ReceivedMessage) error {
		if err := checkPlanned(it, m); err != nil {
			return err
		}
		fresh := retry.ResubmitMessage(m, *ttl)
		if *fresh.MessageID != it.resubmitID {
			return fmt.Errorf("%w: %s would be resubmitted as %s, the preview showed %s; nothing was sent", errChanged, it.ref(), *fresh.MessageID, it.resubmitID)
		}
		if err := sender.SendMessage(ctx, fresh, nil); err != nil {
			return fmt.Errorf("sending to %s: %w", target, err)
		}
		sent++
		if a.hooks.afterResubmit != nil {
			a.hooks.afterResubmit(sent, *m.SequenceNumber)
		}
		if err := r.CompleteMessage(ctx, m, nil); err != nil {
			return fmt.Errorf("sent to %s, but completing the dead letter failed (a re-run resends the same MessageID, which duplicate detection drops): %w", target, err)
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("redrive stopped after %d of %d: %w; run the same command again to finish", done, len(plan), err)
	}
	return a.finish(c.json, rep, err, fmt.Sprintf("resubmitted %d dead letters to %s", done, target))
}
