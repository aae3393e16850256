package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/sbretry/retry/internal/dlqaction"
	"github.com/sbretry/retry/internal/redact"
)

// A run of more than Options.BatchSize messages (an action on all matching, a large group or
// selection) is carried out a batch at a time: each batch is bounded by Options.ActionTimeout on its
// own, so a run of thousands is not cut short by one deadline, and the page shows the progress after
// each batch as it ends, streamed to the browser, then the result. The run is the previewed plan, as
// a run of one batch is: its digest was checked and its started record written before the first
// batch, and its end record says what became of each message.

// batchStep is one line of a batched run's progress.
type batchStep struct {
	N, Of                 int // the batch, of how many
	BatchDone, BatchCount int // done in this batch, of its size
	Done, Count           int // done so far, of the whole plan
	Stopped               bool
}

// runInBatches carries out p, planned and audited as started, a batch at a time, streaming its page:
// the answer is 200 once the first batch starts, and whether the run did everything (done) or stopped
// part way (partial, with the error) is on the page and in the audit record. A batch that fails stops
// the run there, and so does the browser going away (between batches: the batch in hand finishes
// under its own deadline, so a message is never left half done by a closed page).
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
	var warnings []string
	var err error
	done := 0
	for i := 0; i < batches && err == nil; i++ {
		from, to := i*size, min((i+1)*size, n)
		if r.Context().Err() != nil {
			err = fmt.Errorf("the browser went away after %d of %d batches: %w", i, batches, context.Cause(r.Context()))
			break
		}
		// The batch in hand finishes under its own deadline even when the browser goes away.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), c.opts.ActionTimeout)
		var d int
		if p.plan != nil {
			d, err = dlqaction.Execute(ctx, c.client, req.e.inspector(), p.plan.Batch(from, to), &dlqaction.Options{
				Wait: c.opts.ReceiveWait, Warn: func(m string) { warnings = append(warnings, m) },
			})
		} else {
			// Cancel goes in order and stops at the first failure: the first done of the plan are done.
			d, err = dlqaction.Cancel(ctx, req.e.inspector(), p.pending[from:to])
		}
		cancel()
		done += d
		_ = c.tmpl.ExecuteTemplate(w, "batches-step", batchStep{N: i + 1, Of: batches, BatchDone: d, BatchCount: to - from, Done: done, Count: n, Stopped: err != nil})
		_ = rc.Flush()
	}
	if !a.finish(r, done, err, p.auditItems(done)) {
		warnings = append(warnings, "the audit record of this result could not be written: the server's log has the error")
	}
	msg := ""
	if err != nil {
		why := "Service Bus stopped it"
		if errors.Is(err, dlqaction.ErrChanged) {
			why = "a message changed since the preview"
		}
		msg = fmt.Sprintf("%s stopped after %d of %d (%s): %s; the rest was not touched, and running the same action again finishes it", req.action, done, n, why, redact.String(err.Error()))
	}
	pg.Data = resultData(req, p, done, msg, warnings)
	_ = c.tmpl.ExecuteTemplate(w, "batches-end", pg)
}
