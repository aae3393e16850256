package console

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

// hostileID is a MessageID a producer chose to attack the operator: a terminal escape that would
// retitle a terminal and recolour it, a right-to-left override that reverses what follows on screen,
// and markup.
const hostileID = "evil\x1b]0;pwned\x07\x1b[31m\u202e<script>alert(1)</script>"

// scheduleHostile schedules, on the harness's queue, a message carrying a retry attempt (any producer
// can), due at due, with a hostile MessageID and last error.
func scheduleHostile(t *testing.T, h *sbtest.Harness, due time.Time) {
	t.Helper()
	ctx := sbtest.Context(t)
	s, err := h.Client.NewSender(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = s.Close(ctx) }()
	id := hostileID
	m := &azservicebus.Message{MessageID: &id, Body: []byte("x"), ApplicationProperties: map[string]any{
		envelope.PropAttempt: int64(2), envelope.PropLastError: "boom\x1b[2J\x00\u202egnp.exe",
	}}
	_, err = s.ScheduleMessages(ctx, []*azservicebus.Message{m}, due, nil)
	require.NoError(t, err)
}

// assertNoRawControls checks a page shows no control character, bidi override or markup a message
// carried, and shows them escaped instead.
func assertNoRawControls(t *testing.T, what, body string) {
	t.Helper()
	for _, bad := range []string{"\x1b", "\x07", "\x00", "\u202e", "<script>"} {
		assert.NotContains(t, body, bad, "%s shows %q raw", what, bad)
	}
}

// TestFarFuturePendingRetry: a pending retry any producer scheduled for the year 9000 leaves the
// pending page and its chart working (the chart's span overflowed a time.Duration, and a negative
// bucket count panicked in makeslice on every request), and the chart keeps its resolution for the
// retries that are near: the far one is counted as later than the chart's horizon.
func TestFarFuturePendingRetry(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "pending-1") // due in an hour
	scheduleHostile(t, h, time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC))
	s := newSite(t, h, nil)

	code, body := s.get(t, "/api/timeline?e=orders")
	require.Equal(t, http.StatusOK, code, body)
	var tl struct {
		Starts []int64 `json:"starts"`
		Counts []int   `json:"counts"`
		Total  int     `json:"total"`
		Later  int     `json:"later"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &tl))
	assert.Equal(t, 2, tl.Total)
	assert.Equal(t, 1, tl.Later, "the year-9000 retry is beyond the chart")
	require.NotEmpty(t, tl.Counts)
	assert.LessOrEqual(t, len(tl.Counts), timelineBuckets+1)
	assert.Len(t, tl.Starts, len(tl.Counts))
	sum := 0
	for _, n := range tl.Counts {
		sum += n
	}
	assert.Equal(t, 1, sum, "the near retry is on the chart")
	assert.LessOrEqual(t, tl.Starts[1]-tl.Starts[0], int64(5*60), "buckets of a few minutes, not of centuries")

	code, body = s.get(t, "/pending?e=orders")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "9000-01-01 00:00:00Z")
	assertNoRawControls(t, "the pending page", body)
	assert.Contains(t, body, `evil\x1b]0;pwned\x07\x1b[31m\u202e&lt;script&gt;`)
	assert.Contains(t, body, `boom\x1b[2J\x00\u202egnp.exe`)
}

// TestFarPastDueTimeIsBounded: the timeline of a due time far in the past (which a hostile clock or
// message can carry) still has a bounded number of buckets.
func TestTimelineBuckets(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 10, 0, 30, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		due        []time.Time
		later      int
		wantCounts int // the sum of the buckets
	}{
		{"near", []time.Time{now.Add(time.Minute), now.Add(time.Hour)}, 0, 2},
		{"year 9000", []time.Time{now.Add(time.Minute), time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC)}, 1, 1},
		{"the last representable time", []time.Time{time.Unix(1<<62, 0)}, 1, 0},
		{"far past", []time.Time{time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), now.Add(time.Minute)}, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := bucketDueTimes(now, tc.due)
			assert.Equal(t, len(tc.due), tl.Total)
			assert.Equal(t, tc.later, tl.Later)
			assert.LessOrEqual(t, len(tl.Counts), timelineBuckets+1)
			assert.Len(t, tl.Starts, len(tl.Counts))
			sum := 0
			for _, n := range tl.Counts {
				sum += n
			}
			assert.Equal(t, tc.wantCounts, sum)
			for i := 1; i < len(tl.Starts); i++ {
				assert.Greater(t, tl.Starts[i], tl.Starts[i-1], "increasing bucket starts")
			}
		})
	}
}

// deadLetterHostile dead-letters a message with a hostile MessageID, last error, reason and
// properties: a property name with control characters, a value of 30 kB, and a binary one.
func deadLetterHostile(t *testing.T, h *sbtest.Harness) {
	t.Helper()
	ctx := sbtest.Context(t)
	m := sbtest.Message(hostileID)
	m.ApplicationProperties = map[string]any{
		envelope.PropLastError: "failed\x1b[2J\x1b]8;;http://evil.example\x07click\u202e",
		"huge":                 strings.Repeat("A", 30_000),
		"binary":               []byte(strings.Repeat("\x00\xff", 10_000)),
		"name\x1b[1m":          "value\x1b[0m",
	}
	h.Send(t, m)
	r, err := h.Client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	got, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	reason, desc := "Poison\x1b[5m", "bad\x00input"
	require.NoError(t, r.DeadLetterMessage(ctx, got[0], &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: &desc}))
}

// TestHostileDeadLetterOnEveryPage: a dead letter whose id, reason, last error and property names
// carry control characters, terminal escapes, a bidi override and markup, with a huge and a binary
// property, is shown on every page with those characters visible as escapes, never raw, and the
// message page stays small (huge values are clipped, binary ones shown as their size).
func TestHostileDeadLetterOnEveryPage(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	deadLetterHostile(t, h)
	s := newSite(t, h, nil)
	groups := s.groups(t)
	require.Len(t, groups, 1)
	ref := url.QueryEscape("orders/$DeadLetterQueue:1")
	for _, p := range []string{"/", "/deadletters?e=orders", "/group?e=orders&g=" + groups[0], "/message?e=orders&ref=" + ref} {
		code, body := s.get(t, p)
		require.Equal(t, http.StatusOK, code, p)
		assertNoRawControls(t, p, body)
		assert.Less(t, len(body), 40_000, "%s is not a copy of the huge property", p)
		assert.NotContains(t, body, strings.Repeat("A", maxShown+1), "%s clips the huge property", p)
	}
	_, body := s.get(t, "/message?e=orders&ref="+ref)
	assert.Contains(t, body, `evil\x1b]0;pwned\x07\x1b[31m\u202e&lt;script&gt;`)
	assert.Contains(t, body, `failed\x1b[2J\x1b]8;;http://evil.example\x07click\u202e`)
	assert.Contains(t, body, `name\x1b[1m`)
	assert.Contains(t, body, `value\x1b[0m`)
	assert.Contains(t, body, "(20000 bytes of binary data)")
	assert.Contains(t, body, "30000 bytes in all")
	assert.Contains(t, body, `Poison\x1b[5m`)
	assert.Contains(t, body, `bad\x00input`)

	code, body, _, _ := s.preview(t, url.Values{"action": {"purge"}, "g": {groups[0]}})
	require.Equal(t, http.StatusOK, code, body)
	assertNoRawControls(t, "the preview", body)
	assert.Contains(t, body, `evil\x1b]0;pwned`)
}

// TestShowable: the text shown of a message escapes every control character, bidi control and
// invalid byte, keeps ordinary text (accents, CJK, emoji) as it is, and clips.
func TestShowable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain text", "plain text"},
		{"café 注文 🚀", "café 注文 🚀"},
		{"a\x1b[31mb", `a\x1b[31mb`},
		{"nul\x00", `nul\x00`},
		{"tab\tnew\nline", `tab\tnew\nline`},
		{"\u202eabc\u2066", `\u202eabc\u2066`},
		{"c1\u0085\u009b", `c1\u0085\u009b`},
		{"bad\xffutf8", `bad\xffutf8`},
		{"zero\u200bwidth\ufeff", `zero\u200bwidth\ufeff`},
		{`back\slash`, `back\slash`},
	} {
		assert.Equal(t, tc.want, showable(tc.in), "%q", tc.in)
	}
	long := strings.Repeat("é", maxShown+10)
	got := showable(long)
	assert.True(t, strings.HasPrefix(got, strings.Repeat("é", maxShown)))
	assert.Contains(t, got, "bytes in all")
	assert.Equal(t, `multi\nline`, showable("multi\nline"))
	assert.Equal(t, "multi\nline", showableBlock("multi\nline"), "a block keeps its lines")
	assert.Equal(t, `multi\x1bline`, showableBlock("multi\x1bline"))
}

// FuzzShowable: whatever a message carries, what a page shows of it is valid UTF-8 without a control
// or format character, and text without any comes out as it went in.
func FuzzShowable(f *testing.F) {
	for _, s := range []string{"plain", hostileID, "a\nb\tc", "\xff\xfe", "\u200b\ufeff", "é注🚀"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, block := range []bool{false, true} {
			out := escapeText(s, block, maxShown)
			require.True(t, utf8.ValidString(out), "%q", out)
			for _, r := range out {
				if block && (r == '\n' || r == '\t') {
					continue
				}
				require.False(t, unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029', "%q shows %U raw", s, r)
			}
			clean := utf8.ValidString(s) && utf8.RuneCountInString(s) <= maxShown && strings.IndexFunc(s, func(r rune) bool {
				return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
			}) < 0
			if clean {
				require.Equal(t, s, out)
			}
		}
	})
}

// TestHostileFormOnTheAuditPage: a refused action is recorded with what its form named, which a forger
// chooses; the audit page shows it escaped and clipped.
func TestHostileFormOnTheAuditPage(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	s := newSite(t, h, nil)
	hostile := hostileID + strings.Repeat("x", 5000)
	code, _ := s.run(t, url.Values{"action": {hostile}, "g": {hostileID}, "ref": {hostileID}}, hostileID)
	require.Equal(t, http.StatusBadRequest, code)
	code, body := s.get(t, "/audit")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-outcome="refused"`)
	assertNoRawControls(t, "the audit page", body)
	assert.Contains(t, body, `evil\x1b]0;pwned`)
	assert.NotContains(t, body, strings.Repeat("x", maxAuditField+1), "the form's fields are clipped")
}
