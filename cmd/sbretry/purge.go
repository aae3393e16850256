package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// dlqPurge deletes the selected dead letters, after a confirmation on stdin unless --yes. It takes the
// same selection flags as a redrive and the same path through the dead-letter queue (peek to select,
// peek-lock receive, complete exactly the selected sequence numbers, abandon the rest), with a
// complete as the only step: a purge interrupted part way is finished by running it again.
func (a *app) dlqPurge(ctx context.Context, args []string) error {
	var c common
	var f filterFlags
	fs := newFlagSet("dlq purge", &c)
	f.register(fs, true)
	dryRun := fs.Bool("dry-run", false, "")
	yes := fs.Bool("yes", false, "")
	wait := fs.Duration("wait", defaultReceiveWait, "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("dlq purge takes no arguments, got %q", pos)
	}
	filter, err := f.filter(a.now(), true)
	if err != nil {
		return err
	}
	if *wait <= 0 {
		return usagef("--wait must be positive")
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
		fmt.Fprintf(a.stdout, "nothing to purge (read %d messages of %s)\n", sel.scan.Peeked, sel.scan.Entity)
		return nil
	}
	if *dryRun {
		fmt.Fprintf(a.stdout, "would delete %d dead letters from %s:\n", len(sel.items), s.entity.DeadLetterPath())
		for _, d := range sel.items {
			fmt.Fprintf(a.stdout, "  %d %s (%s)\n", d.SequenceNumber, d.MessageID, d.Reason)
		}
		return nil
	}
	// The count shown comes from the selection, so the operator confirms what will actually be
	// deleted. Anything but yes, including end of input (a script that forgot --yes), is a no.
	if !*yes {
		fmt.Fprintf(a.stderr, "Delete %d dead letters from %s for good? Type yes to continue: ", len(sel.items), s.entity.DeadLetterPath())
		line, _ := bufio.NewReader(a.stdin).ReadString('\n')
		if answer := strings.ToLower(strings.TrimSpace(line)); answer != "yes" && answer != "y" {
			return errors.New("purge not confirmed; nothing was deleted")
		}
	}
	done, err := a.drainSelected(ctx, s, sel, *wait, "purge", func(ctx context.Context, r dlqReceiver, m *azservicebus.ReceivedMessage) error {
		return r.CompleteMessage(ctx, m, nil)
	})
	if err != nil {
		return fmt.Errorf("purge stopped after %d of %d: %w; run the same command again to finish", done, len(sel.items), err)
	}
	fmt.Fprintf(a.stdout, "deleted %d dead letters from %s\n", done, s.entity.DeadLetterPath())
	return nil
}
