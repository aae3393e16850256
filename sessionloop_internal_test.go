package retry

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A worker that gives up waiting for the session (its own lock lost) while the first still serves it
// leaves the first one on record: a third worker to accept the session still waits for it.
func TestSessionsServedKeepsAnEarlierTurnAfterAWaiterGivesUp(t *testing.T) {
	var ss sessionsServed
	a := ss.enter("q", "s-1") // A serves s-1; its handler is stuck past the lock
	b := ss.enter("q", "s-1") // B accepted s-1 again
	lockB, loseB := context.WithCancel(context.Background())
	loseB() // B's lock is lost while it waits for A
	assert.False(t, b.awaitEarlier(context.Background(), lockB))
	ss.leave(b)
	c := ss.enter("q", "s-1") // C accepts s-1
	stopped, stop := context.WithCancel(context.Background())
	stop()
	assert.Same(t, a, c.earlier, "C waits for A, which still serves the session")
	assert.False(t, c.awaitEarlier(stopped, context.Background()))
	ss.leave(a)
	assert.True(t, c.awaitEarlier(context.Background(), context.Background()), "once A let go, C goes on")
	ss.leave(c)
	assert.Empty(t, ss.latest, "nothing left on record")
}
