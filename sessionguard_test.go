package retry_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

// Never two handlers for one session in one consumer, even after a lost lock: when the session's lock
// runs out at the broker while its handler runs (before the worker's next renewal could notice), the
// broker lets the session be accepted again, and another worker of the same consumer takes it. That
// worker waits for the first one to let the session go before it runs anything: the session's
// messages still run one at a time, in order.
func TestSessionNeverTwoHandlersAfterALostLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		var mu sync.Mutex
		var events []string
		running := 0
		overlap := false
		release := make(chan struct{})
		first := true
		h := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			mu.Lock()
			events = append(events, "start "+m.MessageID)
			running++
			overlap = overlap || running > 1
			wait := first
			first = false
			mu.Unlock()
			if wait {
				<-release // ignores ctx: a handler that does not watch its context
			}
			mu.Lock()
			events = append(events, "end "+m.MessageID)
			running--
			mu.Unlock()
			return nil
		}
		sc := newSessionConsumer(t, b, h, nil, &retry.Options{}, &retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: time.Second})
		stop := runSessionConsumer(t, sc)
		synctest.Wait()
		b.ExpireLocks() // the broker gives the session up; the first worker has not renewed yet
		// Long enough for the other worker to accept the session again, well before a renewal.
		<-time.After(2 * time.Second)
		synctest.Wait()
		close(release)
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		require.NoError(t, stop())
		mu.Lock()
		defer mu.Unlock()
		assert.False(t, overlap, "two handlers ran for one session at once: %v", events)
		assert.Equal(t, "start s-1", events[0])
	})
}
