package console

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNormalizeError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"digits", "order 17 failed after 250ms", "order <n> failed after <n>ms"},
		{"uuid", "tenant 3f2b8c1e-9a4d-4e6f-8b7a-1c2d3e4f5a6b not found", "tenant <id> not found"},
		{"hex", "trace 0x1f3a and hash 9f86d081884c7d65 mismatch", "trace <hex> and hash <hex> mismatch"},
		{"short words stay", "db2 connection reset", "db<n> connection reset"},
		{"spaces", "  timeout \n calling   ledger ", "timeout calling ledger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, NormalizeError(tc.in))
		})
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	a := Fingerprint("RetryPermanentFailure", "invalid payload in order 17 (id 3f2b8c1e-9a4d-4e6f-8b7a-1c2d3e4f5a6b)")
	b := Fingerprint("RetryPermanentFailure", "invalid payload in order 18 (id 00000000-9a4d-4e6f-8b7a-1c2d3e4f5a6b)")
	assert.Equal(t, a, b, "numbers and ids do not split a group")
	assert.Len(t, a, 12)
	assert.NotEqual(t, a, Fingerprint("RetryMaxAttemptsExceeded", "invalid payload in order 17"), "the reason is part of it")
	assert.NotEqual(t, a, Fingerprint("RetryPermanentFailure", "timeout calling the ledger"))
}

func FuzzNormalizeError(f *testing.F) {
	f.Add("order 17 failed")
	f.Add("0xdeadbeef")
	f.Fuzz(func(t *testing.T, s string) {
		n := NormalizeError(s)
		assert.Equal(t, n, NormalizeError(n), "normalizing twice changes nothing")
	})
}
