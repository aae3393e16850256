package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
)

// selectDeadLetters peeks the dead-letter queues and keeps what the filter selects (see
// dlqaction.Select), warning on stderr about a truncated scan and about refs given with --seq that
// are absent: after a redrive stopped part way, a re-run with the same --seq finds the ones it
// already finished gone.
func (a *app) selectDeadLetters(ctx context.Context, s *session, f inspect.DeadLetterFilter) (*dlqaction.Selection, error) {
	sel, err := dlqaction.Select(ctx, s.inspector, f)
	if err != nil {
		return nil, err
	}
	a.warnTruncated(sel.Scans...)
	if n := len(sel.Unaddressable); n > 0 {
		fmt.Fprintf(a.stderr, "sbretry: warning: %d selected dead letters came without a sequence number and are left alone: nothing can name them\n", n)
	}
	if len(sel.Missing) > 0 {
		fmt.Fprintf(a.stderr, "sbretry: warning: %d of the requested dead letters are not in their dead-letter queue or do not pass the filters (already redriven or purged?): %s\n",
			len(sel.Missing), joinRefs(sel.Missing))
	}
	return sel, nil
}

// printPlan writes the plan as a table, one dead letter a line, named by entity and sequence number.
func printPlan(w io.Writer, p *dlqaction.Plan) error {
	redrive := p.Action == dlqaction.Redrive
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "  ENTITY\tSEQ\tREASON\tORIGINAL ID\tMESSAGE ID"
	if redrive {
		head += "\tRESUBMIT AS"
	}
	fmt.Fprintln(tw, head)
	for _, it := range p.Items {
		d := it.DeadLetter
		// Reasons and ids come from producers: quoted when a terminal would act on them (see printable).
		line := fmt.Sprintf("  %s\t%d\t%s\t%s\t%s", printable(d.Entity), d.SequenceNumber, printable(d.Reason), printable(clip(d.OriginalMessageID(), 60)), printable(d.MessageID))
		if redrive {
			line += "\t" + it.ResubmitID
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// execute carries out the plan through the engine, with progress and warnings on stderr and the
// flags' names in its error messages.
func (a *app) execute(ctx context.Context, s *session, p *dlqaction.Plan, wait time.Duration) (int, error) {
	prog := newProgress(a.stderr, string(p.Action), len(p.Items))
	defer func() { prog.stop(p.Done()) }()
	return dlqaction.Execute(ctx, s.client, s.inspector, p, &dlqaction.Options{
		Wait: wait, WaitName: "--wait", PeekLimitName: "--max-peek",
		Progress:      prog.update,
		Warn:          func(msg string) { fmt.Fprintf(a.stderr, "sbretry: warning: %s\n", msg) },
		AfterResubmit: a.hooks.afterResubmit,
	})
}

// joinRefs lists refs as ENTITY:SEQ, the form --seq and the other commands take.
func joinRefs(refs []inspect.Ref) string { return dlqaction.JoinRefs(refs) }
