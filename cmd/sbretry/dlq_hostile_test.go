package main

import (
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

// TestDLQListQuotesHostileText: the dead-letter reason and description, the message ids, the key and
// (in dlq show) the properties and the body are any producer's text; dlq list and dlq show print each
// quoted when it holds escapes, control characters, bidi overrides or bytes that are not UTF-8, written
// as Go escapes, never raw. (Bytes that are not UTF-8 cannot be sent in an AMQP string; printable escapes
// them too, TestPrintable.) to the operator's terminal.
func TestDLQListQuotesHostileText(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := sbtest.Context(t)
	id := "evil\x1b]0;pwned\x07\u202egnp.exe"
	m := &azservicebus.Message{
		MessageID: &id,
		Body:      []byte("line one\nline \x1b[2J two\u009b"),
		ApplicationProperties: map[string]any{
			envelope.PropKey: "key\x1b[31m\u009b",
			"x\x1b[1m":       "v\x1b[5m",
		},
	}
	h.Send(t, m)
	r, err := h.Client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	got, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	reason, desc := "Poison\x1b[2J\u200b", "bad\x1b[H\x07 \u0085payload"
	require.NoError(t, r.DeadLetterMessage(ctx, got[0], &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: &desc}))

	code, list, errOut := h.cli(t, "", "dlq", "list", "--wide")
	require.Equal(t, exitOK, code, errOut)
	code, show, errOut := h.cli(t, "", "dlq", "show", "1")
	require.Equal(t, exitOK, code, errOut)
	code, preview, errOut := h.cli(t, "", "dlq", "redrive", "--all", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, preview, `"Poison\x1b[2J\u200b"`, "the redrive preview quotes the reason too")
	for name, text := range map[string]string{"dlq list": list, "dlq show": show, "dlq redrive --dry-run": preview} {
		for _, bad := range []string{"\x1b", "\x07", "\u202e", "\u200b", "\x9b", "\xff"} {
			assert.NotContains(t, text, bad, "%s prints %q raw", name, bad)
		}
	}
	assert.Contains(t, list, `"Poison\x1b[2J\u200b"`)
	assert.Contains(t, list, `"evil\x1b]0;pwned\a\u202egnp.exe"`)
	assert.Contains(t, list, `"key\x1b[31m\u009b"`)
	assert.Contains(t, list, `"bad\x1b[H\a payload"`, "a table cell is one line: clip makes NEL a space")
	assert.Contains(t, show, `"Poison\x1b[2J\u200b"`)
	assert.Contains(t, show, `"x\x1b[1m" = "v\x1b[5m"`)
	assert.Contains(t, show, "line one\n", "a body keeps its lines")
	assert.Contains(t, show, `"line \x1b[2J two\u009b"`)
}

// TestPrintableBody: a text body is quoted line by line; bytes that are not UTF-8 (which no AMQP
// string carries, but a body or another client's encoder may) are escaped too.
func TestPrintableBody(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "plain\n\"esc\\x1b[2J\"\n\"\\xff\\x9b\"", printableBody("plain\nesc\x1b[2J\n\xff\x9b"))
	assert.Equal(t, "a\nb", printableBody("a\nb"))
	assert.False(t, strings.ContainsAny(printableBody("\x1b\x07\u202e"), "\x1b\x07\u202e"))
}
