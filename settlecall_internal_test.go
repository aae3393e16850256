package retry

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type expiryProbe struct {
	n    atomic.Int32
	done chan struct{}
}

func newExpiryProbe() *expiryProbe { return &expiryProbe{done: make(chan struct{})} }

func (e *expiryProbe) expire() {
	if e.n.Add(1) == 1 {
		close(e.done)
	}
}

// A reused timer whose firing races with disarm (timers that are due at once) never ends the next call
// it is armed for, and still fires for a call once the races are over.
func TestReusableTimerNeverEndsTheNextCall(t *testing.T) {
	var rt reusableTimer
	for i := range 3000 {
		rt.arm(time.Duration(i%3)*time.Microsecond, newExpiryProbe())
		if i%2 == 0 {
			runtime.Gosched()
		}
		rt.disarm()
		next := newExpiryProbe()
		rt.arm(time.Hour, next)
		for range 3 {
			runtime.Gosched() // room for a late firing to arrive
		}
		rt.disarm()
		require.Zero(t, next.n.Load(), "a late firing ended the next call (iteration %d)", i)
	}
	last := newExpiryProbe()
	rt.arm(time.Millisecond, last)
	select {
	case <-last.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the timer no longer fires")
	}
	rt.disarm()
}

// A settle call is a context: it ends at its deadline with DeadlineExceeded, or once with the first
// cause, and carries the values of the context it was started from.
func TestSettleCallIsAContext(t *testing.T) {
	type key struct{}
	values := context.WithValue(context.Background(), key{}, "v")
	c := &settleCall{values: values, deadline: time.Now().Add(time.Hour)}
	assert.Equal(t, "v", c.Value(key{}))
	d, ok := c.Deadline()
	assert.True(t, ok)
	assert.Equal(t, c.deadline, d)
	done := c.Done()
	assert.NoError(t, c.Err())
	c.expire()
	<-done
	assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	c.end(context.Canceled)
	assert.ErrorIs(t, c.Err(), context.DeadlineExceeded, "the first cause stays")

	late := &settleCall{values: values}
	late.end(context.Canceled)
	<-late.Done() // made after the end: closed at once
	assert.True(t, errors.Is(late.Err(), context.Canceled))

	// Contexts derived from it follow it.
	parent := &settleCall{values: values, deadline: time.Now().Add(time.Hour)}
	child, cancel := context.WithCancel(parent)
	defer cancel()
	parent.end(context.Canceled)
	<-child.Done()
}

// Two late firings on their way at once (both calls ended before their firings ran) are both ignored:
// neither ends the call armed after them.
func TestReusableTimerIgnoresEveryLateFiring(t *testing.T) {
	var rt reusableTimer
	for range 2 {
		rt.arm(time.Hour, newExpiryProbe())
		rt.t.Stop() // as if the timer had fired and its callback not yet run: disarm cannot stop it
		rt.disarm()
	}
	third := newExpiryProbe()
	rt.arm(time.Hour, third)
	rt.fire() // the two late firings arrive
	rt.fire()
	assert.Zero(t, third.n.Load(), "a late firing ended a later call")
	rt.fire() // the third call's own firing
	assert.Equal(t, int32(1), third.n.Load())
	rt.disarm()
}
