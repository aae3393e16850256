package outage_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/outage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStateStrings(t *testing.T) {
	for s, want := range map[outage.State]string{outage.Closed: "closed", outage.Open: "open", outage.HalfOpen: "half-open", 9: "unknown"} {
		assert.Equal(t, want, s.String())
	}
}
