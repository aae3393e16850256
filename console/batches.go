package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sbretry/retry/internal/dlqaction"
	"github.com/sbretry/retry/internal/redact"
)

// A run of more than Options.BatchSize messages (an action on all matching, a large group or
// selection) is carried out in batches: each batch is bounded by Options.ActionTimeout on its own, so
// a run of thousands is not cut short by one deadline, and the page shows the progress after each
// batch as it ends, streamed to the browser, then the result. The run is the previewed plan, as a run
// of one batch is: its digest was checked and its started record written before the first batch, and
// its end record says what became of each message.
//
// A redrive or purge drains each dead-letter queue with one receiver for the whole run, the batches
// being counts of its progress: a receiver closed after each batch would leave locked, until their
// lock expires, the dead letters the broker had already sent it when it closed, and the next batch
// could not receive them (measured on the emulator: one run in six stopped that way). A cancel has no
// receiver; its batches are calls of their own.

// batchStep is one line of a batched run's progress.
type batchStep struct {
	N, Of                 int // the batch, of how many
	BatchDone, BatchCount int // done in this batch, of its size
	Done, Count           int // done so far, of the whole plan
	Stopped               bool
}

// errBrowserGone stops a batched run whose page was closed: the batch in hand finishes, the next does
// not start.
var errBrowserGone = errors.New("the browser went away: the run stopped after the batch in hand")

// runInBatches carries out p, planned and audited as started, in batches, streaming its page: the
// answer is 200 once the first batch starts, and whether the run did everything (done) or stopped
// part way (partial, with the error) is on the page and in the audit record. A batch that fails stops
// the run there, and so does the browser going away (after the batch in hand, which finishes under
// its own deadline, so a message is never left half done by a closed page).
func (c *Console) runInBatches(w http.ResponseWriter, r *http.Request, req *request, p *planned, a *attempt) {
	n, size := p.count(), c.opts.BatchSize
	batches := (n + size - 1) / size
	rc := http.NewResponseController(w)
	// The page (its CSRF cookie included) is made before the answer's header goes out.
	pg := c.pageOf(w, r, "Run: "+req.action, map[string]any{
		"Action": req.action, "Entity": req.e.cfg.Path, "Target": req.e.target, "Count": n, "Batches": batches, "BatchSize": size,
	})
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	// A template error here can only be a broken connection or a bug; the run goes on either way, and
	// its audit record says what it did.
	_ = c.tmpl.ExecuteTemplate(w, "batches-start", pg)
	_ = rc.Flush()
	step, reported := 0, 0
	report := func(done int, stopped bool) {
		step++
		_ = c.tmpl.ExecuteTemplate(w, "batches-step", batchStep{N: step, Of: batches, BatchDone: done - reported, BatchCount: min(size, n-reported),
			Done: done, Count: n, Stopped: stopped})
		_ = rc.Flush()
		reported = done
	}
	var warnings []string
	var done int
	var err error
	if p.plan != nil {
		done, err = c.drainInBatches(r, req, p, size, report, &warnings)
	} else {
		for i := 0; i < batches && err == nil; i++ {
			from, to := i*size, min((i+1)*size, n)
			if r.Context().Err() != nil {
				err = errBrowserGone
				break
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), c.opts.ActionTimeout)
			// Cancel goes in order and stops at the first failure: the first done of the plan are done.
			var d int
			d, err = dlqaction.Cancel(ctx, req.e.inspector(), p.pending[from:to])
			cancel()
			done += d
			report(done, err != nil)
		}
	}
	if !a.finish(r, done, err, p.auditItems(done)) {
		warnings = append(warnings, "the audit record of this result could not be written: the server's log has the error")
	}
	msg := ""
	if err != nil {
		why := "Service Bus stopped it"
		switch {
		case errors.Is(err, dlqaction.ErrChanged):
			why = "a message changed since the preview"
		case errors.Is(err, errBrowserGone):
			why = "the page was closed"
		}
		msg = fmt.Sprintf("%s stopped after %d of %d (%s): %s; the rest was not touched, and running the same action again finishes it", req.action, done, n, why, redact.String(err.Error()))
	}
	pg.Data = resultData(req, p, done, msg, warnings)
	_ = c.tmpl.ExecuteTemplate(w, "batches-end", pg)
}

// drainInBatches executes a redrive or purge plan with one drain, reporting a batch each time size
// more messages are done. Each batch has ActionTimeout: the deadline moves on at every batch's end,
// and the run stops when a batch overruns it, or at a batch's end when the browser went away.
func (c *Console) drainInBatches(r *http.Request, req *request, p *planned, size int, report func(done int, stopped bool), warnings *[]string) (int, error) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	defer cancel(nil)
	overrun := fmt.Errorf("a batch ran longer than the action timeout %v", c.opts.ActionTimeout)
	deadline := time.AfterFunc(c.opts.ActionTimeout, func() { cancel(overrun) })
	defer deadline.Stop()
	reported := 0
	n := p.count()
	done, err := dlqaction.Execute(ctx, c.client, req.e.inspector(), p.plan, &dlqaction.Options{
		Wait: c.opts.ReceiveWait,
		Warn: func(m string) { *warnings = append(*warnings, m) },
		Progress: func(done int) {
			if done-reported < size && done < n {
				return
			}
			report(done, false)
			reported = done
			deadline.Reset(c.opts.ActionTimeout)
			if r.Context().Err() != nil && done < n {
				cancel(errBrowserGone)
			}
		},
	})
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		report(done, true)
	}
	return done, err
}
