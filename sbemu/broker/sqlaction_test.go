package broker

import (
	"testing"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSQLActionApplies(t *testing.T) {
	stmts, err := parseSQLAction("SET total = quantity * 2; SET sys.To = 'elsewhere'; REMOVE Color; SET quantity = 0")
	require.NoError(t, err)
	m := filterMessage()
	applyAction(stmts, m, 1)
	assert.Equal(t, int64(20), m.ApplicationProperties["total"], "computed from the value before the action")
	assert.Equal(t, int64(0), m.ApplicationProperties["quantity"], "keeps the message's spelling")
	assert.NotContains(t, m.ApplicationProperties, "Color", "REMOVE ignores case")
	assert.Equal(t, "elsewhere", *m.Properties.To)

	// SET to an unknown value removes the property.
	stmts, err = parseSQLAction("SET vip = missing")
	require.NoError(t, err)
	applyAction(stmts, m, 1)
	assert.NotContains(t, m.ApplicationProperties, "vip")

	// A message without properties gets them.
	bare := &amqp.Message{}
	stmts, err = parseSQLAction("SET sys.Label = 'x'; SET a = 'b'")
	require.NoError(t, err)
	applyAction(stmts, bare, 1)
	assert.Equal(t, "x", *bare.Properties.Subject)
	assert.Equal(t, "b", bare.ApplicationProperties["a"])
}

func TestSQLActionErrors(t *testing.T) {
	tests := []struct{ name, action, wantText string }{
		{"empty", ";", "empty action"},
		{"unknown statement", "UPDATE a = 1", "expected SET or REMOVE"},
		{"missing value", "SET a =", "unexpected end"},
		{"garbage after a statement", "SET a = 1 b = 2", "expected ';' or the next statement"},
		{"undefined parameter", "SET a = @nope", "parameter @nope is not defined"},
		{"remove a system property", "REMOVE sys.To", "cannot be removed"},
		{"set a read-only system property", "SET sys.SequenceNumber = 1", "cannot be SET"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseSQLAction(tc.action)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidFilter)
			assert.Contains(t, err.Error(), tc.wantText)
		})
	}
}

// TestSQLActionParametersAndOptionalSeparators: statements need no ';'
// between them, and @parameters take the rule's values (the SDK's live
// test TestAdminClient_CreateRules writes "SET MessageID=@stringVar SET
// MessageID=@intVar").
func TestSQLActionParametersAndOptionalSeparators(t *testing.T) {
	stmts, err := parseSQLActionWith("SET greeting = @Greeting SET count = @n * 2 REMOVE old", map[string]any{"@greeting": "hello", "n": int32(21)})
	require.NoError(t, err)
	m := newMsg("1", "x")
	m.ApplicationProperties = map[string]any{"old": true}
	applyAction(stmts, m, 1)
	assert.Equal(t, "hello", m.ApplicationProperties["greeting"])
	assert.Equal(t, int64(42), m.ApplicationProperties["count"])
	assert.NotContains(t, m.ApplicationProperties, "old")
}
