package retry

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
)

// On an injected clock, afterFunc runs f once when the clock passes d, and a stop before that prevents
// it and reports so; a stop after it reports that it came too late.
func TestAfterFuncOnAnInjectedClock(t *testing.T) {
	mock := clock.NewMock()
	var calls atomic.Int32
	ran := make(chan struct{}, 1)
	f := func() { calls.Add(1); ran <- struct{}{} }

	st := afterFunc(mock, time.Second, f)
	mock.Add(999 * time.Millisecond)
	assert.Zero(t, calls.Load())
	mock.Add(time.Millisecond)
	<-ran
	assert.False(t, st.Stop(), "too late to stop")
	assert.Equal(t, int32(1), calls.Load())

	st = afterFunc(mock, time.Second, f)
	assert.True(t, st.Stop())
	assert.False(t, st.Stop(), "stopped once")
	mock.Add(time.Hour)
	assert.Equal(t, int32(1), calls.Load(), "a stopped call never runs")
}
