package redact

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestString(t *testing.T) {
	cases := []struct {
		name, in, secret string
	}{
		{"connection string key", "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=abc123+/=;EntityPath=q", "abc123"},
		{"lower case key", "endpoint=sb://x/;sharedaccesskey=s3cr3t", "s3cr3t"},
		{"key at end", "SharedAccessKey=topsecret", "topsecret"},
		{"signature in connection string", "Endpoint=sb://x/;SharedAccessSignature=SharedAccessSignature sr=x&sig=zzzsig&se=1&skn=k", "zzzsig"},
		{"bare token", "token: SharedAccessSignature sr=amqp%3A%2F%2Fx&sig=Qm9vbQ%3D%3D&se=17&skn=Root", "Qm9vbQ"},
		{"quoted", `connect "SharedAccessKey=quoted1" failed`, "quoted1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := String(tc.in)
			assert.NotContains(t, out, tc.secret)
			assert.Contains(t, out, "REDACTED")
		})
	}
	assert.Equal(t, "nothing secret here", String("nothing secret here"))
	assert.Contains(t, String("SharedAccessKeyName=Root;SharedAccessKey=x"), "SharedAccessKeyName=Root")
}

func TestWrap(t *testing.T) {
	base := errors.New("bad SharedAccessKey=hunter2")
	err := Wrap(base)
	assert.NotContains(t, err.Error(), "hunter2")
	assert.ErrorIs(t, err, base)
	assert.NoError(t, Wrap(nil))
}
