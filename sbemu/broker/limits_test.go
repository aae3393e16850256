package broker

import (
	"strings"
	"testing"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPropertyLimits(t *testing.T) {
	cases := []struct {
		name  string
		props map[string]any
		ok    bool
	}{
		{"small", map[string]any{"a": "b", "n": int64(1)}, true},
		{"one property just under 32 KiB", map[string]any{"p": strings.Repeat("x", MaxPropertySize-20)}, true},
		{"one property over 32 KiB", map[string]any{"p": strings.Repeat("x", MaxPropertySize)}, false},
		{"binary property over 32 KiB", map[string]any{"p": make([]byte, MaxPropertySize)}, false},
		{"three 30 KiB properties over 64 KiB", map[string]any{
			"a": strings.Repeat("x", 30*1024), "b": strings.Repeat("x", 30*1024), "c": strings.Repeat("x", 30*1024)}, false},
		{"two 30 KiB properties under 64 KiB", map[string]any{
			"a": strings.Repeat("x", 30*1024), "b": strings.Repeat("x", 30*1024)}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(Options{}, QueueConfig{Name: "q", MaxMessageSize: 1 << 20})
			require.NoError(t, err)
			defer b.Close()
			q, _ := b.Queue("q")
			m := &amqp.Message{ApplicationProperties: tc.props, Data: [][]byte{[]byte("x")}}
			_, _, err = q.Send(m, 100)
			if tc.ok {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrPropertiesTooLarge)
				assert.Zero(t, q.Stats().Active, "nothing stored")
			}
		})
	}
}
