package console

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/internal/syncbuf"
)

// readAudit reads the audit file's records, oldest first.
func readAudit(t *testing.T, path string) []AuditRecord {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []AuditRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var rec AuditRecord
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), sc.Text())
		out = append(out, rec)
	}
	require.NoError(t, sc.Err())
	return out
}

// TestAuditRecordsEveryAction: a reader's refused preview, an operator's purge of a group (started,
// then done, with each message), a run whose selection changed since its preview (refused) and a
// cancel (started, done) are each recorded, with who, the selection, the preview's digest and the outcome, in the
// file and as log lines; no secret reaches either; the audit page shows them, newest first, to a
// reader too.
func TestAuditRecordsEveryAction(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2", "pending-1")
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	var logs syncbuf.Buffer
	c, err := New(h.Client, entitiesOf(h), &Options{Tokens: twoRoles, AuditFile: path, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	reader, operator := serve(t, h, c), serve(t, h, c)
	reader.signIn(t, readerSecret)
	operator.signIn(t, operatorSecret)
	g := operator.groups(t)[0]

	code, _, _, _ := reader.preview(t, url.Values{"action": {"purge"}, "g": {g}})
	require.Equal(t, http.StatusForbidden, code)

	form := url.Values{"action": {"purge"}, "g": {g}, "confirm": {"2"}}
	code, body, digest, refs := operator.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, refs, 2)
	code, body = operator.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	// The same run again: the group is gone, so it is refused.
	code, _ = operator.run(t, form, digest)
	require.Equal(t, http.StatusConflict, code)

	_, pendingBody := operator.get(t, "/pending?e=orders")
	m := regexp.MustCompile(`name="ref" value="(orders:[0-9]+)"`).FindStringSubmatch(pendingBody)
	require.NotNil(t, m, pendingBody)
	pendingRef := m[1]
	cancelForm := url.Values{"action": {"cancel"}, "ref": {pendingRef}}
	code, body, cdigest, _ := operator.preview(t, cancelForm)
	require.Equal(t, http.StatusOK, code, body)
	code, body = operator.run(t, cancelForm, cdigest)
	require.Equal(t, http.StatusOK, code, body)

	recs := readAudit(t, path)
	require.Len(t, recs, 6)
	refused := recs[0]
	assert.Equal(t, "alice", refused.Who)
	assert.Equal(t, "reader", refused.Role)
	assert.Equal(t, "purge", refused.Action)
	assert.Equal(t, "preview", refused.Step)
	assert.Equal(t, AuditRefused, refused.Outcome)
	assert.Equal(t, "orders", refused.Entity)
	assert.Equal(t, g, refused.Group)
	assert.Contains(t, refused.Reason, "may only read")
	assert.NotEmpty(t, refused.Remote)

	started, done := recs[1], recs[2]
	for _, r := range []AuditRecord{started, done} {
		assert.Equal(t, "bob", r.Who)
		assert.Equal(t, "operator", r.Role)
		assert.Equal(t, "run", r.Step)
		assert.Equal(t, g, r.Group)
		assert.Equal(t, digest, r.Digest)
		assert.Equal(t, 2, r.Count)
		require.Len(t, r.Items, 2)
		assert.Equal(t, refs, []string{r.Items[0].Ref, r.Items[1].Ref})
		assert.ElementsMatch(t, []string{"perm-1", "perm-2"}, []string{r.Items[0].MessageID, r.Items[1].MessageID})
		assert.False(t, r.Time.IsZero())
	}
	assert.Equal(t, AuditStarted, started.Outcome)
	assert.False(t, started.Items[0].Done || started.Items[1].Done)
	assert.Equal(t, AuditDone, done.Outcome)
	assert.Equal(t, 2, done.Done)
	assert.True(t, done.Items[0].Done && done.Items[1].Done)

	assert.Equal(t, AuditRefused, recs[3].Outcome)
	assert.Contains(t, recs[3].Reason, "nothing was done")
	assert.Equal(t, digest, recs[3].Digest)

	assert.Equal(t, AuditStarted, recs[4].Outcome)
	cancelled := recs[5]
	assert.Equal(t, "cancel", cancelled.Action)
	assert.Equal(t, AuditDone, cancelled.Outcome)
	assert.Equal(t, []string{pendingRef}, cancelled.Refs)
	require.Len(t, cancelled.Items, 1)
	assert.Equal(t, AuditItem{Ref: pendingRef, MessageID: cancelled.Items[0].MessageID, Done: true}, cancelled.Items[0])
	assert.Equal(t, 0, h.Stats(t).Scheduled)

	// The log lines: one per record (the started one included), structured, without secrets.
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var actions []map[string]any
	for _, l := range lines {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		if m["msg"] == "sbretry console action" {
			actions = append(actions, m)
		}
	}
	require.Len(t, actions, 6)
	assert.Equal(t, "alice", actions[0]["who"])
	assert.Equal(t, "WARN", actions[0]["level"])
	assert.Equal(t, "done", actions[2]["outcome"])
	assert.Equal(t, digest, actions[2]["digest"])
	assert.Len(t, actions[2]["items"], 2)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, secret := range []string{readerSecret, operatorSecret} {
		assert.NotContains(t, logs.String(), secret)
		assert.NotContains(t, string(raw), secret)
	}
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	// The page: newest first, readable by the reader.
	code, body = reader.get(t, "/audit")
	require.Equal(t, http.StatusOK, code, body)
	outcomes := regexp.MustCompile(`data-outcome="([a-z]+)"`).FindAllStringSubmatch(body, -1)
	var got []string
	for _, m := range outcomes {
		got = append(got, m[1])
	}
	assert.Equal(t, []string{"done", "started", "refused", "done", "started", "refused"}, got)
	assert.Contains(t, body, "bob (operator)")
	assert.NotContains(t, body, "audit-memory", "the records are in a file")
}

// TestRunIsRefusedWhenItCannotBeAudited: a run whose started record cannot be written is not carried
// out.
func TestRunIsRefusedWhenItCannotBeAudited(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s := newSite(t, h, &Options{AuditFile: path, Logger: slog.New(slog.DiscardHandler)})
	form := url.Values{"action": {"purge"}, "ref": {"orders/$DeadLetterQueue:1"}, "confirm": {"yes"}}
	code, body, digest, _ := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	// The file's place is taken by a directory: nothing can be appended there.
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.Mkdir(path, 0o700))
	code, body = s.run(t, form, digest)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "could not be written, so it was not carried out")
	assert.Equal(t, 1, h.Stats(t).DeadLettered, "nothing was purged")
}

// TestNewRefusesAnUnwritableAuditFile: an audit file that cannot be opened for appending fails New.
func TestNewRefusesAnUnwritableAuditFile(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	_, err := New(h.Client, entitiesOf(h), &Options{AuditFile: filepath.Join(t.TempDir(), "no", "such", "dir", "audit.jsonl")})
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

// TestAuditPages: the audit log pages newest first, in the file (across chunk boundaries, with a
// record larger than a chunk and a torn line) and in memory.
func TestAuditPages(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	file := &auditLog{logger: slog.New(slog.DiscardHandler), path: path}
	memory := &auditLog{logger: slog.New(slog.DiscardHandler)}
	ctx := t.Context()
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	for i := range 120 {
		rec := AuditRecord{Time: at.Add(time.Duration(i) * time.Second), Who: fmt.Sprint("op-", i), Action: "purge", Outcome: AuditDone}
		if i == 60 {
			for j := range 3000 { // about 100 kB: more than a chunk
				rec.Items = append(rec.Items, AuditItem{Ref: fmt.Sprintf("orders/$DeadLetterQueue:%d", j), Done: true})
			}
		}
		require.NoError(t, file.record(ctx, rec))
		require.NoError(t, memory.record(ctx, rec))
		if i == 99 {
			// A crash tore a write: the next record still starts a line of its own.
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			_, err = f.WriteString(`{"time":"2026-12-07T10:0`)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}
	}
	whos := func(p *auditPage) []string {
		var out []string
		for _, r := range p.Records {
			out = append(out, r.Who)
		}
		return out
	}
	for _, log := range []*auditLog{file, memory} {
		first, err := log.page(0, 3)
		require.NoError(t, err)
		assert.Equal(t, []string{"op-119", "op-118", "op-117"}, whos(first))
		assert.True(t, first.More)
	}
	// In the file, the torn line is one line among the records, shown as unreadable.
	p, err := file.page(19, 2)
	require.NoError(t, err)
	assert.Equal(t, []string{"op-100"}, whos(p))
	assert.Equal(t, 1, p.Unreadable)
	p, err = file.page(58, 3) // lines: op-119…op-100 (20), the torn one, op-99…: the 59th is op-62
	require.NoError(t, err)
	assert.Equal(t, []string{"op-62", "op-61", "op-60"}, whos(p))
	require.Len(t, p.Records[2].Items, 3000)
	p, err = file.page(118, 5)
	require.NoError(t, err)
	assert.Equal(t, []string{"op-2", "op-1", "op-0"}, whos(p))
	assert.False(t, p.More)
	p, err = memory.page(118, 5)
	require.NoError(t, err)
	assert.Equal(t, []string{"op-1", "op-0"}, whos(p))
	assert.False(t, p.More)
}

// TestMemoryAuditIsBounded: without a file, the audit log keeps at most memoryAuditRecords records and
// memoryAuditItems messages in all, dropping the oldest first (the newest is kept, however large).
func TestMemoryAuditIsBounded(t *testing.T) {
	t.Parallel()
	log := &auditLog{logger: slog.New(slog.DiscardHandler)}
	for i := range memoryAuditRecords + 5 {
		require.NoError(t, log.record(t.Context(), AuditRecord{Who: fmt.Sprint("op-", i)}))
	}
	assert.Len(t, log.memory, memoryAuditRecords)
	assert.Equal(t, "op-5", log.memory[0].Who)
	big := AuditRecord{Who: "big", Items: make([]AuditItem, memoryAuditItems/2+1)}
	require.NoError(t, log.record(t.Context(), big))
	require.NoError(t, log.record(t.Context(), big))
	assert.Len(t, log.memory, 1, "two records of more than half the items: only the newest stays")
	assert.Equal(t, memoryAuditItems/2+1, log.items)
	huge := AuditRecord{Who: "huge", Items: make([]AuditItem, memoryAuditItems+1)}
	require.NoError(t, log.record(t.Context(), huge))
	require.Len(t, log.memory, 1)
	assert.Equal(t, "huge", log.memory[0].Who)
}

// A reader's refused posts cannot push the operators' actions off the in-memory audit page: over the
// bound, refusals are dropped first.
func TestMemoryAuditKeepsActionsOverRefusals(t *testing.T) {
	t.Parallel()
	log := &auditLog{logger: slog.New(slog.DiscardHandler)}
	require.NoError(t, log.record(t.Context(), AuditRecord{Who: "operator", Outcome: AuditDone}))
	for i := range 2 * memoryAuditRecords {
		require.NoError(t, log.record(t.Context(), AuditRecord{Who: fmt.Sprint("reader-", i), Outcome: AuditRefused}))
	}
	assert.Len(t, log.memory, memoryAuditRecords)
	assert.Equal(t, "operator", log.memory[0].Who, "the action stays")
	assert.Equal(t, fmt.Sprint("reader-", 2*memoryAuditRecords-1), log.memory[len(log.memory)-1].Who, "the newest refusal stays")
}

// TestAppendAuditRecord: a record another program appends (the sbretry CLI) is one line of the file,
// in UTC, and the audit log's page reads it back as written.
func TestAppendAuditRecord(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.FixedZone("CET", 3600))
	rec := AuditRecord{Time: at, Who: "alice", Role: "cli", Action: "purge", Step: stepRun, Entity: "orders",
		Refs: []string{"orders:7"}, Outcome: AuditDone, Done: 1, Count: 1, Items: []AuditItem{{Ref: "orders:7", Done: true}}}
	require.NoError(t, AppendAuditRecord(path, rec))
	log := &auditLog{logger: slog.New(slog.DiscardHandler), path: path}
	pg, err := log.page(0, 10)
	require.NoError(t, err)
	require.Len(t, pg.Records, 1)
	want := rec
	want.Time = at.UTC()
	assert.Equal(t, want, pg.Records[0])
	assert.Equal(t, time.UTC, pg.Records[0].Time.Location())
	require.Error(t, AppendAuditRecord(filepath.Join(t.TempDir(), "missing", "audit.jsonl"), rec))
}
