package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os/user"

	"github.com/sbretry/retry/console"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
	"github.com/sbretry/retry/internal/redact"
)

// envOperator names the operator of the acting commands when --operator is not given.
const envOperator = "SBRETRY_OPERATOR"

// auditRole is the Role of the CLI's audit records: the console's are a token's role, so the page
// tells an action from the command line from one in the browser.
const auditRole = "cli"

// auditFlags are the flags of the commands that act (dlq redrive, dlq purge, cancel, sessions release,
// pause, resume): --audit-file appends their records, in the console's format
// (console.AppendAuditRecord), to the file the console's /audit page shows.
type auditFlags struct {
	file     string
	operator string
}

func (f *auditFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.file, "audit-file", "", "")
	fs.StringVar(&f.operator, "operator", "", "")
}

// auditor writes the audit records of one run of an acting command. A nil *auditor (no --audit-file)
// records nothing.
//
// As in the console, a run writes a started record before it touches anything and does not act if that
// record cannot be written; its end record follows. A dry run is a preview and is not recorded, as the
// console records no preview it allowed.
type auditor struct {
	a    *app
	path string
	rec  console.AuditRecord
}

// newAuditor returns the auditor of action, or nil without --audit-file. The operator is --operator,
// else $SBRETRY_OPERATOR, else the name of the OS user running the command.
func (a *app) newAuditor(f *auditFlags, action string) *auditor {
	if f.file == "" {
		return nil
	}
	who := f.operator
	if who == "" {
		who = a.getenv(envOperator)
	}
	if who == "" {
		if u, err := user.Current(); err == nil {
			who = u.Username
		}
	}
	if who == "" {
		who = "(unknown)"
	}
	return &auditor{a: a, path: f.file, rec: console.AuditRecord{Who: who, Role: auditRole, Action: action, Step: "run"}}
}

// selection records what the run acts on: the entity and the entity-qualified refs.
func (au *auditor) selection(entity string, refs []inspect.Ref) {
	if au == nil {
		return
	}
	au.rec.Entity, au.rec.Refs = entity, nil
	for _, r := range refs {
		au.rec.Refs = append(au.rec.Refs, r.String())
	}
}

// session records the session a release acts on.
func (au *auditor) session(id string) {
	if au != nil {
		au.rec.Session = id
	}
}

// start writes the started record with the planned items. Its error means nothing may be done.
func (au *auditor) start(items []console.AuditItem) error {
	if au == nil {
		return nil
	}
	au.rec.Outcome, au.rec.Items, au.rec.Count = console.AuditStarted, items, len(items)
	if err := au.write(); err != nil {
		return fmt.Errorf("%s: the audit record could not be written, so nothing was done: %w", au.rec.Action, err)
	}
	return nil
}

// refuse records a run the operator did not confirm, with the items it would have acted on, and
// returns err.
func (au *auditor) refuse(err error, items []console.AuditItem) error {
	if au == nil {
		return err
	}
	au.rec.Outcome, au.rec.Reason, au.rec.Items, au.rec.Count = console.AuditRefused, redact.String(err.Error()), items, len(items)
	if werr := au.write(); werr != nil {
		return errors.Join(err, fmt.Errorf("the audit record could not be written: %w", werr))
	}
	return err
}

// end writes the end record: done when runErr is nil, partial when done > 0, else failed. It returns
// runErr, joined with the write's error when the record could not be written: a command whose record
// is missing never reports plain success.
func (au *auditor) end(done int, runErr error, items []console.AuditItem) error {
	if au == nil {
		return runErr
	}
	au.rec.Items, au.rec.Done, au.rec.Count, au.rec.Outcome, au.rec.Reason = items, done, len(items), console.AuditDone, ""
	if runErr != nil {
		au.rec.Reason = redact.String(runErr.Error())
		au.rec.Outcome = console.AuditPartial
		if done == 0 {
			au.rec.Outcome = console.AuditFailed
		}
	}
	werr := au.write()
	if werr == nil {
		return runErr
	}
	werr = fmt.Errorf("%s: the audit record of the end of the run (%s, %d of %d done) could not be written: %w", au.rec.Action, au.rec.Outcome, done, len(items), werr)
	if runErr == nil {
		return werr
	}
	return errors.Join(runErr, werr)
}

// write logs the record as a structured line on stderr (the console logs the same line) and appends it
// to the audit file.
func (au *auditor) write() error {
	au.rec.Time = au.a.now()
	console.LogAuditRecord(context.Background(), slog.New(slog.NewTextHandler(au.a.stderr, nil)), "sbretry action", au.rec)
	return console.AppendAuditRecord(au.path, au.rec)
}

// sessionAuditItem is the single item of a release, named as the console names it: the held message
// by entity and sequence number (the session, when nothing is held), with the wake-up's MessageID.
func sessionAuditItem(rel *inspect.SessionRelease, done bool) []console.AuditItem {
	it := console.AuditItem{Ref: "session " + rel.SessionID, ResubmittedAs: rel.Plan.WakeID, Done: done}
	if h := rel.Plan.Before.Hold; h != nil {
		it.Ref = inspect.Ref{Entity: rel.Entity, SequenceNumber: h.SequenceNumber}.String()
		it.MessageID = redact.String(h.MessageID)
	}
	return []console.AuditItem{it}
}

// planAuditItems are a redrive's or purge's dead letters and what became of each.
func planAuditItems(p *dlqaction.Plan) []console.AuditItem {
	out := make([]console.AuditItem, len(p.Items))
	for i, it := range p.Items {
		out[i] = console.AuditItem{Ref: it.Ref().String(), MessageID: redact.String(it.DeadLetter.MessageID), ResubmittedAs: it.ResubmitID, Done: it.Done}
	}
	return out
}

// pendingAuditItems are a cancel's pending retries, the first done of them cancelled.
func pendingAuditItems(items []inspect.Pending, done int) []console.AuditItem {
	out := make([]console.AuditItem, len(items))
	for i, q := range items {
		out[i] = console.AuditItem{Ref: q.Ref().String(), MessageID: redact.String(q.MessageID), Done: i < done}
	}
	return out
}
