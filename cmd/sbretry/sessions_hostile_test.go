package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sessionstate"
)

// TestSessionsListQuotesHostileText: the session id, the held message's id, the dead-letter reason
// and the last error are any producer's text; sessions list and the release's dry run print each
// quoted, with its escapes, control characters, bidi override and bytes that are not UTF-8 written
// as Go escapes, never raw to the operator's terminal.
func TestSessionsListQuotesHostileText(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	const sid = "s-\x1b[31mred"
	st := sessionstate.State{Hold: &sessionstate.Hold{
		SequenceNumber: 1, MessageID: "evil\x1b]0;pwned\x07\u202egnp.exe", Attempt: 3,
		DeadLetterReason: "Poison\x1b[2J", DeadLetteredAt: time.Now().UTC().Truncate(time.Millisecond),
		LastError: "boom\x1b[2J\u200b\xff",
	}}
	raw, err := sessionstate.Marshal(st)
	require.NoError(t, err)
	h.SetState(t, sid, raw)

	code, out, errOut := h.cli(t, "", "sessions", "list")
	require.Equal(t, exitOK, code, errOut)
	code, dry, errOut := h.cli(t, "", "sessions", "release", "--session", sid, "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	for name, text := range map[string]string{"sessions list": out, "the release's dry run": dry} {
		for _, bad := range []string{"\x1b", "\x07", "\u202e", "\u200b", "\x9b", "\xff"} {
			assert.NotContains(t, text, bad, "%s prints %q raw", name, bad)
		}
	}
	assert.Contains(t, out, `"s-\x1b[31mred"`)
	assert.Contains(t, out, `"evil\x1b]0;pwned\a\u202egnp.exe"`)
	assert.Contains(t, out, `Poison\x1b[2J`)
	assert.Contains(t, out, `boom\x1b[2J\u200b`)
	assert.Contains(t, dry, `"evil\x1b]0;pwned\a\u202egnp.exe"`)
	assert.Contains(t, dry, `"Poison\x1b[2J"`)
}

// TestPrintable: what a terminal would act on or show misleadingly is quoted; plain text is not.
// The record's JSON turns bytes that are not UTF-8 into U+FFFD, but other text printed reaches the
// terminal as the broker gave it: a lone 0x9b is a CSI to an 8-bit terminal.
func TestPrintable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"order-42", "order-42"},
		{"été ✓", "été ✓"},
		{"a\x1b[31m", `"a\x1b[31m"`},
		{"a\x9b2J", `"a\x9b2J"`},
		{"a\xff", `"a\xff"`},
		{"\u202egnp", `"\u202egnp"`},
		{"zero\u200bwidth", `"zero\u200bwidth"`},
		{"tab\there", `"tab\there"`},
	} {
		assert.Equal(t, tc.want, printable(tc.in), "%q", tc.in)
	}
}
