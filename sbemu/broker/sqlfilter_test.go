package broker

import (
	"testing"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// filterMessage is the message the filter table is evaluated against.
func filterMessage() *amqp.Message {
	subject, to, ct := "urgent-order", "store-5", "application/json"
	return &amqp.Message{
		Properties: &amqp.MessageProperties{MessageID: "m-1", CorrelationID: "c-1", Subject: &subject, To: &to, ContentType: &ct},
		ApplicationProperties: map[string]any{
			"Color": "blue", "quantity": int32(10), "price": 9.5, "vip": true, "path": "a%b", "nothing": nil,
		},
	}
}

func TestSQLFilterEvaluation(t *testing.T) {
	src := messageProperties{m: filterMessage(), size: 100}
	tests := []struct {
		expr string
		want bool
	}{
		{"TRUE", true},
		{"FALSE", false},
		{"1=1", true},
		{"1=0", false},
		{"color = 'blue'", true},
		{"COLOR = 'blue'", true}, // property names ignore case
		{"user.color = 'blue'", true},
		{"color = 'Blue'", false}, // values do not
		{"[Color] = 'blue'", true},
		{`"Color" = 'blue'`, true},
		{"quantity = 10", true},
		{"quantity > 9 AND quantity <= 10", true},
		{"quantity <> 10", false},
		{"quantity != 11", true},
		{"quantity = 10.0", true}, // long and double compare numerically
		{"price > 9", true},
		{"price * 2 = 19", true},
		{"quantity + 1 = 11", true},
		{"quantity % 3 = 1", true},
		{"-quantity < 0", true},
		{"vip = TRUE", true},
		{"vip", true},
		{"NOT vip", false},
		{"color IN ('red', 'blue')", true},
		{"color NOT IN ('red', 'blue')", false},
		{"color IN ('red')", false},
		{"sys.Label LIKE '%order'", true},
		{"sys.Label LIKE 'urgent_order'", true},
		{"sys.Label LIKE 'urgent'", false},
		{"sys.Label NOT LIKE '%x%'", true},
		{"path LIKE 'a!%b' ESCAPE '!'", true},
		{"path LIKE 'a!%c' ESCAPE '!'", false},
		{"sys.To IN ('store-5', 'store-6') OR missing = 1", true},
		{"sys.MessageId = 'm-1' AND sys.CorrelationId = 'c-1'", true},
		{"sys.ContentType = 'application/json'", true},
		{"sys.Size = 100", true},
		{"missing IS NULL", true},
		{"nothing IS NULL", true},
		{"color IS NOT NULL", true},
		{"EXISTS(color)", true},
		{"EXISTS(missing)", false},
		{"NOT EXISTS(missing)", true},
		{"EXISTS(sys.SessionId)", false},
		// Unknown propagates: neither a comparison nor its negation matches.
		{"missing = 1", false},
		{"NOT (missing = 1)", false},
		{"missing = 1 OR TRUE", true},
		{"missing = 1 AND FALSE", false},
		{"missing = 1 AND TRUE", false},
		{"color = 1", false}, // a string never equals a number
		{"(color = 'blue' OR color = 'red') AND NOT quantity < 5", true},
		{"'a' + 'b' = 'ab'", true},
		{"quantity / 0 = 1", false},
		{"  color='blue'  ", true},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			n, err := parseSQLFilter(tc.expr)
			require.NoError(t, err)
			assert.Equal(t, tc.want, matchSQL(n, src))
		})
	}
}

func TestSQLFilterErrors(t *testing.T) {
	tests := []struct {
		name, expr, wantText string
	}{
		{"empty", "", "unexpected end of expression"},
		{"dangling operator", "color =", "unexpected end of expression"},
		{"unbalanced parenthesis", "(color = 'blue'", `expected ")"`},
		{"unterminated string", "color = 'blue", "unterminated '"},
		{"unknown character", "color = #1", "unexpected character"},
		{"trailing garbage", "color = 'blue' blue", "after the end"},
		{"unknown system property", "sys.Colour = 'x'", "unknown system property sys.Colour"},
		{"unknown scope", "app.color = 'x'", `unknown scope "app"`},
		{"function", "newid() = 'x'", "function newid() is not supported"},
		{"IS without NULL", "color IS 'x'", "expected NULL after IS"},
		{"NOT without IN or LIKE", "color NOT = 'x'", "expected IN or LIKE"},
		{"escape too long", "color LIKE 'x' ESCAPE 'ab'", "ESCAPE needs a string of one character"},
		{"integer out of range", "q = 99999999999999999999", "out of the 64-bit range"},
		{"keyword as identifier", "AND = 1", "unexpected"},
		{"too deep", string(make([]byte, 0)) + repeat("(", 300) + "1=1" + repeat(")", 300), "nested deeper"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseSQLFilter(tc.expr)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidFilter)
			assert.Contains(t, err.Error(), tc.wantText)
		})
	}
}

func repeat(s string, n int) string {
	out := make([]byte, 0, len(s)*n)
	for range n {
		out = append(out, s...)
	}
	return string(out)
}

func TestLikeMatch(t *testing.T) {
	tests := []struct {
		s, pat string
		want   bool
	}{
		{"", "", true},
		{"", "%", true},
		{"abc", "%", true},
		{"abc", "a%c", true},
		{"abc", "a_c", true},
		{"abbbc", "a%c", true},
		{"abc", "a%d", false},
		{"abc", "%b%", true},
		{"abc", "____", false},
		{"a%c", `a\%c`, true},
		{"abc", `a\%c`, false},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, likeMatch([]rune(tc.s), []rune(tc.pat), '\\', true), "%q LIKE %q", tc.s, tc.pat)
	}
}

// FuzzSQLFilter feeds arbitrary text to the parser and, when it parses,
// evaluates it: neither may panic or hang.
func FuzzSQLFilter(f *testing.F) {
	for _, seed := range []string{
		"color = 'blue'", "sys.Label LIKE '%x' ESCAPE '!'", "a IN (1, 2.5, 'x')", "NOT EXISTS(b) OR c IS NULL",
		"(((1)))", "-+-1 = 1", "[x]]y] = \"q\"\"\"", "SET a = 1; REMOVE b",
		"a = @p AND b > @n", "SET a = @p SET sys.Label = @n", "@", "@@p",
	} {
		f.Add(seed)
	}
	src := messageProperties{m: filterMessage(), size: 1}
	params := map[string]any{"@p": "x", "n": int64(1)}
	f.Fuzz(func(t *testing.T, expr string) {
		if n, err := parseSQLFilterWith(expr, params); err == nil {
			matchSQL(n, src)
		}
		if stmts, err := parseSQLActionWith(expr, params); err == nil {
			applyAction(stmts, CopyMessage(src.m), 1)
		}
	})
}

// TestSQLFilterParameters: @parameters in a filter take the rule's values,
// whatever the case of their names, and a filter naming one the rule lacks
// is refused when the rule is configured.
func TestSQLFilterParameters(t *testing.T) {
	params := map[string]any{"@Region": "eu", "@min": int64(10), "@ratio": 0.5, "@on": true}
	n, err := parseSQLFilterWith("region = @region AND amount >= @MIN AND share > @ratio AND vip = @on", params)
	require.NoError(t, err)
	msg := func(region string, amount int) *amqp.Message {
		m := newMsg("1", "x")
		m.ApplicationProperties = map[string]any{"region": region, "amount": int32(amount), "share": 0.75, "vip": true}
		return m
	}
	assert.True(t, matchSQL(n, messageProperties{m: msg("eu", 10)}))
	assert.False(t, matchSQL(n, messageProperties{m: msg("us", 10)}))
	assert.False(t, matchSQL(n, messageProperties{m: msg("eu", 9)}))

	_, err = parseSQLFilterWith("region = @missing", params)
	assert.ErrorIs(t, err, ErrInvalidFilter)
	assert.ErrorContains(t, err, "parameter @missing is not defined")
	b, err := New(Options{Topics: []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "s",
		Rules: []RuleConfig{{Name: "r", SQLFilter: "a = @x", SQLFilterParameters: map[string]any{"x": int64(1)}}}}}}}})
	require.NoError(t, err, "a parameter may be named without its @")
	b.Close()
	_, err = New(Options{Topics: []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "s",
		Rules: []RuleConfig{{Name: "r", SQLFilter: "a = @x"}}}}}}})
	assert.ErrorIs(t, err, ErrInvalidConfig)
}
