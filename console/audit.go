package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sbretry/retry/internal/redact"
)

// The audit log: every action the console is asked for (redrive, purge, cancel, release) is recorded
// with who asked (the token's name), when, what was selected, the digest of the preview and what
// became of each message: as one structured log line (Options.Logger) and, with Options.AuditFile, as
// one JSON line appended to that file and synced to disk. The /audit page shows the records, newest
// first. A run writes a "started" record before it touches anything, and refuses to act if that record
// cannot be written: no action goes unrecorded. A refused action (a reader's, a forged form, a
// selection that changed since its preview) is recorded as refused. The sbretry command line appends
// its own actions to the same file through [AppendAuditRecord], so the page lists them too.

// Outcomes of an [AuditRecord].
const (
	// AuditRefused is an action refused before anything was done: the role, the CSRF check, the
	// selection, the confirmation.
	AuditRefused = "refused"
	// AuditStarted is written before a run acts; the record of its end follows. A started record
	// without its end says the console stopped during the run.
	AuditStarted = "started"
	// AuditDone is a run that did everything its preview showed.
	AuditDone = "done"
	// AuditPartial is a run that stopped part way: its Items say which messages were done.
	AuditPartial = "partial"
	// AuditFailed is a run that did nothing, because Service Bus refused or failed.
	AuditFailed = "failed"
)

// AuditRecord is one record of the audit log, as the structured log line and the JSON line of
// [Options.AuditFile] carry it. The JSON names are stable.
type AuditRecord struct {
	// Time is when the record was written, in UTC.
	Time time.Time `json:"time"`
	// Who is the name of the token the request presented ([Token].Name), or "(no token)" for a
	// console without tokens; Role is its role; Remote the address the request came from (a proxy's,
	// behind one). A record of the sbretry command line has its operator as Who, Role "cli" and no
	// Remote.
	Who    string `json:"who"`
	Role   string `json:"role"`
	Remote string `json:"remote,omitempty"`
	// Action is redrive, purge, cancel or release, as the form named it (the command line also
	// records pause and resume); Step is "preview" or "run".
	Action string `json:"action"`
	Step   string `json:"step"`
	// Entity, Group, Session and Refs are the selection as the request named it: the entity, a whole
	// failure group, a session (release), or entity-qualified sequence numbers.
	Entity  string   `json:"entity,omitempty"`
	Group   string   `json:"group,omitempty"`
	Session string   `json:"session,omitempty"`
	Refs    []string `json:"refs,omitempty"`
	// Filter describes the filter an action on all matching selected its messages with (a body
	// filter only by its length), as the preview showed it; the refs are what it matched.
	Filter string `json:"filter,omitempty"`
	// Digest is the preview's digest the run was posted with.
	Digest string `json:"digest,omitempty"`
	// Outcome is one of the Audit… constants; Reason says why an action was refused, failed or
	// stopped (redacted).
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
	// Done and Count are how many of the planned messages the run acted on, of how many.
	Done  int `json:"done"`
	Count int `json:"count"`
	// Items are the planned messages and what became of each.
	Items []AuditItem `json:"items,omitempty"`
}

// AuditItem is one message of an audited action.
type AuditItem struct {
	// Ref is the message's entity-qualified reference; MessageID its MessageID (redacted).
	Ref       string `json:"ref"`
	MessageID string `json:"messageId,omitempty"`
	// ResubmittedAs is the MessageID of a redrive's fresh delivery.
	ResubmittedAs string `json:"resubmittedAs,omitempty"`
	// Done says the action was carried out on this message.
	Done bool `json:"done"`
}

// memoryAuditRecords is how many records a console without an audit file keeps, in memory, for its
// audit page, and memoryAuditItems how many messages they may list in all (a run lists up to MaxPeek
// of them): the oldest records are dropped first when either is reached.
const (
	memoryAuditRecords = 1000
	memoryAuditItems   = 100_000
)

// auditLog writes the records: the log line, and the file or the memory ring. It is safe for
// concurrent use.
type auditLog struct {
	logger *slog.Logger
	path   string // empty: memory only

	mu     sync.Mutex
	memory []AuditRecord // oldest first, within memoryAuditRecords and memoryAuditItems
	items  int           // the items of memory's records
}

// record writes rec: the log line always, then the file (or the memory ring). The error is the file's:
// a run whose started record fails is not carried out.
func (a *auditLog) record(ctx context.Context, rec AuditRecord) error {
	rec.Time = rec.Time.UTC()
	LogAuditRecord(ctx, a.logger, "sbretry console action", rec)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.path == "" {
		a.memory = append(a.memory, rec)
		a.items += len(rec.Items)
		// Over the bounds, refusals go first, oldest first: a reader's refused posts (each passes the
		// CSRF check with the reader's own token) must not push the operators' actions off the page.
		for len(a.memory) > memoryAuditRecords || (a.items > memoryAuditItems && len(a.memory) > 1) {
			i := slices.IndexFunc(a.memory[:len(a.memory)-1], func(r AuditRecord) bool { return r.Outcome == AuditRefused })
			if i < 0 {
				i = 0
			}
			a.items -= len(a.memory[i].Items)
			a.memory = slices.Delete(a.memory, i, i+1) // copies down: the backing array does not grow
		}
		return nil
	}
	if err := AppendAuditRecord(a.path, rec); err != nil {
		a.logger.LogAttrs(ctx, slog.LevelError, "sbretry console: the audit record could not be written", slog.String("file", a.path), slog.String("error", err.Error()))
		return err
	}
	return nil
}

// LogAuditRecord writes rec as one structured log line with msg (the console's "sbretry console action",
// the CLI's "sbretry action"): at INFO when it started or is done, at WARN otherwise. Every action is
// logged this way, and also appended to the audit file ([AppendAuditRecord]) when there is one.
func LogAuditRecord(ctx context.Context, logger *slog.Logger, msg string, rec AuditRecord) {
	level := slog.LevelInfo
	if rec.Outcome != AuditDone && rec.Outcome != AuditStarted {
		level = slog.LevelWarn
	}
	logger.LogAttrs(ctx, level, msg,
		slog.String("who", rec.Who), slog.String("role", rec.Role), slog.String("remote", rec.Remote),
		slog.String("action", rec.Action), slog.String("step", rec.Step), slog.String("entity", rec.Entity),
		slog.String("group", rec.Group), slog.String("session", rec.Session), slog.String("filter", rec.Filter), slog.Any("refs", rec.Refs),
		slog.String("digest", rec.Digest), slog.String("outcome", rec.Outcome), slog.String("reason", rec.Reason),
		slog.Int("done", rec.Done), slog.Int("count", rec.Count), slog.Any("items", rec.Items))
}

// AppendAuditRecord appends rec to the audit file at path as one JSON line, synced to disk before it
// returns: the file [Options.AuditFile] names and the /audit page shows. It is how another program
// (the sbretry CLI) records its actions where the console's page lists them, in the one format.
// rec.Time is stored in UTC. Concurrent appends from several processes each land as a whole line.
func AppendAuditRecord(path string, rec AuditRecord) error {
	rec.Time = rec.Time.UTC()
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("console: encoding the audit record: %w", err)
	}
	return appendLine(path, line)
}

// appendLine appends line and a newline to the file at path as one write, and syncs it (and, when it
// created the file, its directory) to disk. The file is opened for each record, so a rotation that
// moves it away is followed by a new file. A line torn by a crash is ended first, so the new record
// starts a line of its own.
func appendLine(path string, line []byte) error {
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, os.ErrNotExist)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("console: opening the audit file: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 0, len(line)+2)
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, fi.Size()-1); err == nil && last[0] != '\n' {
			buf = append(buf, '\n')
		}
	}
	buf = append(append(buf, line...), '\n')
	if _, err := f.Write(buf); err != nil {
		return fmt.Errorf("console: writing the audit file: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("console: syncing the audit file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("console: closing the audit file: %w", err)
	}
	if created {
		if d, err := os.Open(filepath.Dir(path)); err == nil {
			_ = d.Sync() // the new file's name; a directory that cannot be synced is the file system's
			_ = d.Close()
		}
	}
	return nil
}

// auditPage is one page of records, newest first.
type auditPage struct {
	Records []AuditRecord
	// Unreadable counts the lines of the page's span that are not records (a torn line, another
	// program's text): shown, never hidden.
	Unreadable int
	// More says older records follow.
	More bool
}

// page returns the records skip to skip+size, counted from the newest.
func (a *auditLog) page(skip, size int) (*auditPage, error) {
	if a.path == "" {
		a.mu.Lock()
		defer a.mu.Unlock()
		out := &auditPage{}
		for i := len(a.memory) - 1 - skip; i >= 0 && len(out.Records) < size; i-- {
			out.Records = append(out.Records, a.memory[i])
		}
		out.More = len(a.memory)-skip-len(out.Records) > 0
		return out, nil
	}
	f, err := os.Open(a.path)
	if errors.Is(err, os.ErrNotExist) {
		return &auditPage{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("console: opening the audit file: %w", err)
	}
	defer f.Close()
	out := &auditPage{}
	n := 0
	err = eachLineBackwards(f, func(line []byte) bool {
		if len(bytes.TrimSpace(line)) == 0 {
			return true
		}
		n++
		if n <= skip {
			return true
		}
		if len(out.Records)+out.Unreadable == size {
			out.More = true
			return false
		}
		var rec AuditRecord
		if json.Unmarshal(line, &rec) != nil {
			out.Unreadable++
			return true
		}
		out.Records = append(out.Records, rec)
		return true
	})
	return out, err
}

// auditChunk is how much of the audit file eachLineBackwards reads at a time.
const auditChunk = 64 << 10

// eachLineBackwards calls fn with each line of f, the last first, until fn returns false; it reads the
// file from its end in chunks, so a page of recent records costs a read of their lines only.
func eachLineBackwards(f *os.File, fn func([]byte) bool) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("console: reading the audit file: %w", err)
	}
	end := fi.Size()
	var tail []byte // the start of a line whose beginning is in an earlier chunk
	for end > 0 {
		start := max(end-auditChunk, 0)
		n := int(end - start)
		chunk := make([]byte, n, n+len(tail))
		if _, err := f.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("console: reading the audit file: %w", err)
		}
		chunk = append(chunk, tail...)
		for {
			i := bytes.LastIndexByte(chunk, '\n')
			if i < 0 {
				break
			}
			if !fn(chunk[i+1:]) {
				return nil
			}
			chunk = chunk[:i]
		}
		tail = chunk
		end = start
	}
	if len(tail) > 0 {
		fn(tail)
	}
	return nil
}

// auditPageSize is the number of records of one audit page.
const auditPageSize = 50

// auditHandler shows the audit log, newest first, a page at a time. Readers may see it.
func (c *Console) auditHandler(w http.ResponseWriter, r *http.Request) {
	pageNo, err := intParam(r, "page", 0)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	pg, err := c.audit.page(pageNo*auditPageSize, auditPageSize)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, "reading the audit log: %v", err)
		return
	}
	next := -1
	if pg.More {
		next = pageNo + 1
	}
	c.render(w, r, http.StatusOK, "audit.html", "Audit log", map[string]any{
		"Records": pg.Records, "Unreadable": pg.Unreadable, "File": c.audit.path != "", "Memory": memoryAuditRecords,
		"Page": pageNo, "Next": next, "Prev": pageNo - 1,
	})
}

// Steps of an audited action.
const (
	stepPreview = "preview"
	stepRun     = "run"
)

// attempt is one action request being handled, with its audit record filled in as the request is
// read and carried out.
type attempt struct {
	c   *Console
	rec AuditRecord
}

// newAttempt starts the audit record of the request r at step, naming who sent it.
func (c *Console) newAttempt(r *http.Request, step string) *attempt {
	p := principalOf(r)
	return &attempt{c: c, rec: AuditRecord{Who: p.who(), Role: p.Role.String(), Remote: r.RemoteAddr, Step: step}}
}

// maxAuditField bounds each field of the selection as a form named it: a refused form may be forged,
// and its record should not be a copy of a megabyte of it.
const maxAuditField = 256

// fillFromForm records the selection as the parsed form names it, before it is checked: a refused
// request is recorded with what it asked for. Long fields are clipped, and at most maxRefs refs kept.
func (a *attempt) fillFromForm(r *http.Request, maxRefs int) {
	clip := clipAuditField
	a.rec.Action, a.rec.Entity, a.rec.Group = clip(r.PostFormValue("action")), clip(r.PostFormValue("e")), clip(r.PostFormValue("g"))
	a.rec.Session, a.rec.Digest = clip(r.PostFormValue("session")), clip(r.PostFormValue("digest"))
	refs := r.PostForm["ref"]
	for _, ref := range refs[:min(len(refs), maxRefs)] {
		a.rec.Refs = append(a.rec.Refs, clip(ref))
	}
}

// clipAuditField clips a field of a form for the audit record.
func clipAuditField(s string) string {
	if len(s) > maxAuditField {
		return s[:maxAuditField] + "…"
	}
	return s
}

// refuse shows the error page with status and the message, and audits the refusal: every refusal of
// a run, and at the preview a refusal of who sent it (403: the role, the CSRF check), which is an
// attempt to act all the same. A run refused because Service Bus failed (5xx) is audited as failed.
func (a *attempt) refuse(w http.ResponseWriter, r *http.Request, status int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if a.rec.Step == stepRun || status == http.StatusForbidden {
		a.rec.Outcome, a.rec.Reason = AuditRefused, redact.String(msg)
		if status >= 500 {
			a.rec.Outcome = AuditFailed
		}
		_ = a.write(r)
	}
	a.c.fail(w, r, status, "%s", msg)
}

// start writes the started record of a run with its planned items, and reports whether it was
// written: a run is carried out only then.
func (a *attempt) start(r *http.Request, items []AuditItem) bool {
	a.rec.Outcome, a.rec.Items, a.rec.Count = AuditStarted, items, len(items)
	return a.write(r) == nil
}

// finish writes the end of a run: done when it did everything, partial when it stopped part way,
// failed when it did nothing; items say what became of each message. It reports whether the record
// was written.
func (a *attempt) finish(r *http.Request, done int, err error, items []AuditItem) bool {
	a.rec.Items, a.rec.Done, a.rec.Outcome = items, done, AuditDone
	if err != nil {
		a.rec.Reason = redact.String(err.Error())
		a.rec.Outcome = AuditPartial
		if done == 0 {
			a.rec.Outcome = AuditFailed
		}
	}
	return a.write(r) == nil
}

// write appends the record, stamped now.
func (a *attempt) write(r *http.Request) error {
	a.rec.Time = a.c.now()
	// The request's context may be ending (the browser went away): the record is written all the same.
	return a.c.audit.record(context.WithoutCancel(r.Context()), a.rec)
}
