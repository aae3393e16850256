package storetest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRec builds records whose chain is the envelope's.
func TestRec(t *testing.T) {
	r := Rec("a", 1, 1, 1, 0)
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
}
