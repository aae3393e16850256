package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/console"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/outage"
)

// readAuditFile reads the records of an audit file, oldest first; a missing file has none.
func readAuditFile(t *testing.T, path string) []console.AuditRecord {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	defer f.Close()
	var out []console.AuditRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec console.AuditRecord
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), sc.Text())
		out = append(out, rec)
	}
	require.NoError(t, sc.Err())
	return out
}

// outcomes lists the records' outcomes, in order.
func outcomes(recs []console.AuditRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Outcome
	}
	return out
}

// TestRedriveIsAudited: a redrive with --audit-file appends a started record, then its end with who,
// the selection and what became of each dead letter; its dry run writes nothing.
func TestRedriveIsAudited(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1", "perm-2")
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	args := []string{"dlq", "redrive", "--all", "--audit-file", path, "--operator", "alice"}

	code, _, errOut := h.cli(t, "", append(args, "--dry-run")...)
	require.Equal(t, exitOK, code, errOut)
	assert.Empty(t, readAuditFile(t, path), "a dry run is a preview: not recorded, as in the console")

	rep := h.actionJSON(t, "", append(args, "--json")...)
	require.Equal(t, 2, rep.Done)
	recs := readAuditFile(t, path)
	require.Equal(t, []string{console.AuditStarted, console.AuditDone}, outcomes(recs))
	for _, rec := range recs {
		assert.Equal(t, "alice", rec.Who)
		assert.Equal(t, auditRole, rec.Role)
		assert.Equal(t, "redrive", rec.Action)
		assert.Equal(t, "run", rec.Step)
		assert.Equal(t, sbtest.Queue, rec.Entity)
		assert.Len(t, rec.Refs, 2)
		assert.Equal(t, 2, rec.Count)
		assert.False(t, rec.Time.IsZero())
		require.Len(t, rec.Items, 2)
	}
	assert.Equal(t, 0, recs[0].Done)
	assert.False(t, recs[0].Items[0].Done, "the started record plans, it has done nothing")
	end := recs[1]
	assert.Equal(t, 2, end.Done)
	for i, it := range end.Items {
		assert.True(t, it.Done)
		assert.Equal(t, rep.Items[i].ResubmitMessageID, it.ResubmittedAs)
		assert.Equal(t, rep.Items[i].Entity+":"+strconv.FormatInt(rep.Items[i].SequenceNumber, 10), it.Ref)
		assert.Contains(t, end.Refs, it.Ref)
	}
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), h.Em.ConnectionString())
	assert.NotContains(t, string(raw), "SharedAccessKey")
}

// TestPurgeAndCancelAreAudited: a purge the operator does not confirm is recorded as refused; a
// confirmed purge and a cancel as done, each message with its outcome.
func TestPurgeAndCancelAreAudited(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ps := h.seed(t, "perm-1", "pending-1")
	path := filepath.Join(t.TempDir(), "audit.jsonl")

	code, _, _ := h.cli(t, "no\n", "dlq", "purge", "--all", "--audit-file", path, "--operator", "bob")
	require.Equal(t, exitError, code)
	recs := readAuditFile(t, path)
	require.Equal(t, []string{console.AuditRefused}, outcomes(recs))
	assert.Contains(t, recs[0].Reason, "purge not confirmed")
	assert.Len(t, recs[0].Items, 1)

	code, _, errOut := h.cli(t, "", "dlq", "purge", "--all", "--yes", "--audit-file", path, "--operator", "bob")
	require.Equal(t, exitOK, code, errOut)
	// The same record is a structured log line on stderr, as the console logs its actions.
	assert.Contains(t, errOut, `msg="sbretry action" who=bob role=cli`)
	assert.Contains(t, errOut, "action=purge")
	assert.Contains(t, errOut, "outcome=done")
	recs = readAuditFile(t, path)
	require.Equal(t, []string{console.AuditRefused, console.AuditStarted, console.AuditDone}, outcomes(recs))
	assert.Equal(t, "purge", recs[2].Action)
	assert.Equal(t, "bob", recs[2].Who)
	assert.Equal(t, 1, recs[2].Done)
	require.Len(t, recs[2].Items, 1)
	assert.True(t, recs[2].Items[0].Done)

	r, ok := sbtest.Result(ps, "pending-1", retry.OutcomeRetryScheduled)
	require.True(t, ok)
	seq := strconv.FormatInt(r.SequenceNumber, 10)
	code, _, errOut = h.cli(t, "", "cancel", seq, "--yes", "--audit-file", path, "--operator", "bob")
	require.Equal(t, exitOK, code, errOut)
	recs = readAuditFile(t, path)
	require.Len(t, recs, 5)
	end := recs[4]
	assert.Equal(t, []string{console.AuditStarted, console.AuditDone}, outcomes(recs[3:]))
	assert.Equal(t, "cancel", end.Action)
	assert.Equal(t, []string{sbtest.Queue + ":" + seq}, end.Refs)
	require.Len(t, end.Items, 1)
	assert.Equal(t, r.RetryMessageID, end.Items[0].MessageID)
	assert.True(t, end.Items[0].Done)
}

// TestAnUnwritableAuditFileStopsTheAction: when the started record cannot be written, the command
// fails and does nothing; it never reports success.
func TestAnUnwritableAuditFileStopsTheAction(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ps := h.seed(t, "perm-1", "pending-1")
	bad := filepath.Join(t.TempDir(), "no", "such", "dir", "audit.jsonl")
	r, ok := sbtest.Result(ps, "pending-1", retry.OutcomeRetryScheduled)
	require.True(t, ok)

	for name, args := range map[string][]string{
		"redrive": {"dlq", "redrive", "--all"},
		"purge":   {"dlq", "purge", "--all", "--yes"},
		"cancel":  {"cancel", strconv.FormatInt(r.SequenceNumber, 10), "--yes"},
	} {
		code, out, errOut := h.cli(t, "", append(args, "--audit-file", bad)...)
		assert.Equal(t, exitError, code, name)
		assert.Contains(t, errOut, "the audit record could not be written, so nothing was done", name)
		assert.NotContains(t, out, "resubmitted", name)
		assert.NotContains(t, out, "deleted", name)
		assert.NotContains(t, out, "cancelled", name)
	}
	st := h.Stats(t)
	assert.Equal(t, 1, st.DeadLettered)
	assert.Equal(t, 1, st.Scheduled)
}

// TestSessionsReleaseIsAudited: a release is recorded with its session.
func TestSessionsReleaseIsAudited(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	f := h.Hold(t, "s1", "", "a1", "a2")
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	code, _, errOut := h.cli(t, "", "sessions", "release", "--session", "s1", "--yes", "--audit-file", path, "--operator", "carol")
	require.Equal(t, exitOK, code, errOut)
	recs := readAuditFile(t, path)
	require.Equal(t, []string{console.AuditStarted, console.AuditDone}, outcomes(recs))
	end := recs[1]
	assert.Equal(t, "release", end.Action)
	assert.Equal(t, "carol", end.Who)
	assert.Equal(t, sessionQueue, end.Entity)
	assert.Equal(t, "s1", end.Session)
	require.Len(t, end.Items, 1)
	assert.Equal(t, sessionQueue+":"+strconv.FormatInt(f.Held, 10), end.Items[0].Ref, "the held message, as the console names it")
	assert.Equal(t, "a1", end.Items[0].MessageID)
	assert.NotEmpty(t, end.Items[0].ResubmittedAs, "the wake-up's MessageID")
	assert.True(t, end.Items[0].Done)
}

// TestPauseAndResumeAreAudited: pause and resume record the consumer, never its token; a dry run
// and outage record nothing.
func TestPauseAndResumeAreAudited(t *testing.T) {
	c, u := controlledConsumer(t, "tok-secret")
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	auth := []string{"--consumer", u, "--token", "tok-secret", "--audit-file", path, "--operator", "dave"}

	code, _, errOut := cliNoEntity(t, "", append([]string{"pause", "--dry-run"}, auth...)...)
	require.Equal(t, exitOK, code, errOut)
	assert.Empty(t, readAuditFile(t, path))
	code, _, _ = cliNoEntity(t, "", append([]string{"outage"}, auth...)...)
	assert.Equal(t, exitUsage, code, "outage only reads")

	code, _, errOut = cliNoEntity(t, "", append([]string{"pause", "--reason", "migration"}, auth...)...)
	require.Equal(t, exitOK, code, errOut)
	code, _, errOut = cliNoEntity(t, "", append([]string{"resume"}, auth...)...)
	require.Equal(t, exitOK, code, errOut)
	recs := readAuditFile(t, path)
	require.Equal(t, []string{console.AuditStarted, console.AuditDone, console.AuditStarted, console.AuditDone}, outcomes(recs))
	assert.Equal(t, "pause", recs[1].Action)
	assert.Equal(t, "resume", recs[3].Action)
	for _, rec := range recs {
		assert.Equal(t, "dave", rec.Who)
		assert.Equal(t, u, rec.Entity)
	}
	assert.Equal(t, 1, recs[3].Done)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "tok-secret")

	// An audit file that cannot be written: the command fails and the consumer is not paused.
	bad := []string{"pause", "--consumer", u, "--token", "tok-secret", "--audit-file", filepath.Join(t.TempDir(), "missing", "a.jsonl")}
	code, _, errOut = cliNoEntity(t, "", bad...)
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "the audit record could not be written, so nothing was done")
	assert.Equal(t, outage.Closed, c.Health().Outage.State)
}

// TestAuditOperator: --operator, else $SBRETRY_OPERATOR, else the OS user.
func TestAuditOperator(t *testing.T) {
	t.Parallel()
	env := map[string]string{}
	a := &app{getenv: func(k string) string { return env[k] }, now: time.Now}
	assert.Nil(t, a.newAuditor(&auditFlags{operator: "x"}, "purge"), "no file, no records")
	assert.Equal(t, "x", a.newAuditor(&auditFlags{file: "f", operator: "x"}, "purge").rec.Who)
	env[envOperator] = "from-env"
	assert.Equal(t, "from-env", a.newAuditor(&auditFlags{file: "f"}, "purge").rec.Who)
	delete(env, envOperator)
	u, err := user.Current()
	require.NoError(t, err)
	assert.Equal(t, u.Username, a.newAuditor(&auditFlags{file: "f"}, "purge").rec.Who)
}

// TestConsoleShowsCLIRecords: `sbretry serve --audit-file` shows on its /audit page the record a CLI
// redrive wrote to the same file.
func TestConsoleShowsCLIRecords(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1")
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	code, _, errOut := h.cli(t, "", "dlq", "redrive", "--all", "--audit-file", path, "--operator", "erin-from-cli")
	require.Equal(t, exitOK, code, errOut)

	addrs := make(chan string, 1)
	var out, serveErr bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: &serveErr, getenv: func(string) string { return "" }, now: time.Now,
		hooks: hooks{serving: func(addr string) { addrs <- addr }}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- a.run(ctx, []string{"--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue, "serve",
			"--listen", "127.0.0.1:0", "--audit-file", path})
	}()
	var addr string
	select {
	case addr = <-addrs:
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, serveErr.String())
	case <-sbtest.Context(t).Done():
		t.Fatal("serve did not listen")
	}
	client := &http.Client{Timeout: sbtest.Timeout}
	resp, err := client.Get("http://" + addr + "/audit")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), `data-who="erin-from-cli"`)
	assert.Contains(t, string(body), "erin-from-cli (cli)")
	assert.Contains(t, string(body), `data-action="redrive"`)
	cancel()
	assert.Equal(t, exitOK, <-done)
}

// TestAFailedEndRecordFailsTheCommand: a redrive that did its work but whose end record cannot be
// written exits 1 naming the audit file's error, and never prints plain success.
func TestAFailedEndRecordFailsTheCommand(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1")
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	// After the started record, the audit file's path becomes a directory: the end cannot be written.
	hk := hooks{afterResubmit: func(int, int64) {
		assert.NoError(t, os.Remove(path))
		assert.NoError(t, os.Mkdir(path, 0o700))
	}}
	code, out, errOut := h.cliWith(t, hk, "", "dlq", "redrive", "--all", "--audit-file", path, "--operator", "frank")
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "the audit record of the end of the run (done, 1 of 1 done) could not be written")
	assert.NotContains(t, out, "resubmitted 1 dead letters")
	assert.Equal(t, 0, h.Stats(t).DeadLettered, "the redrive itself was done")
}
