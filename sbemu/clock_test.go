package sbemu

import (
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// The third-party fake clock fits the interface as it is, without adapters.
var (
	_ Clock = clock.New()
	_ Clock = clock.NewMock()
)

// fakeClock is the smallest Clock a user could write: it proves the
// interface needs nothing beyond the standard library. Advance fires due
// channels before it returns.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	pending []fakeTimer
}

type fakeTimer struct {
	at time.Time
	c  chan time.Time
}

func newFakeClock(now time.Time) *fakeClock { return &fakeClock{now: now} }

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan time.Time, 1)
	if d <= 0 {
		c <- f.now
		return c
	}
	f.pending = append(f.pending, fakeTimer{at: f.now.Add(d), c: c})
	return c
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	kept := f.pending[:0]
	for _, t := range f.pending {
		if t.at.After(f.now) {
			kept = append(kept, t)
			continue
		}
		t.c <- f.now // capacity 1 and sent once: never blocks
	}
	f.pending = kept
}

// TestSDKFakeClock drives scheduled activation, lock expiry and TTL through
// the real SDK by advancing a fake clock; nothing in it waits for real time
// to pass. Receives that block while the clock moves are woken by the
// broker's own wake-up, not by a later call.
func TestSDKFakeClock(t *testing.T) {
	// The present, to the millisecond of an AMQP timestamp: the SDK reads the
	// times the emulator stamps, so they should look like real ones.
	start := time.Now().Truncate(time.Millisecond)

	t.Run("scheduled message activates", func(t *testing.T) {
		fake := newFakeClock(start)
		em := startEmulator(t, Config{Clock: fake, Queues: []broker.QueueConfig{{Name: "q"}}})
		client := newClient(t, em)
		sender := newSender(t, client, "q")
		receiver := newReceiver(t, client, "q", nil)

		at := start.Add(time.Hour)
		_, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{{Body: []byte("in an hour")}}, at, nil)
		require.NoError(t, err)
		q, _ := em.Broker().Queue("q")
		require.Equal(t, broker.Stats{Scheduled: 1}, q.Stats())

		received := make(chan *azservicebus.ReceivedMessage)
		go func() {
			msgs, err := receiver.ReceiveMessages(ctxT(t), 1, nil)
			assert.NoError(t, err)
			assert.Len(t, msgs, 1)
			received <- msgs[0]
		}()
		waitFor(t, func() bool { return em.receiversWaiting() == 1 }) // parked before the clock moves
		fake.Advance(59 * time.Minute)
		assert.Equal(t, broker.Stats{Scheduled: 1}, q.Stats(), "not due yet")
		fake.Advance(time.Minute)

		msg := <-received
		assert.Equal(t, "in an hour", string(msg.Body))
		require.NotNil(t, msg.EnqueuedTime)
		assert.True(t, msg.EnqueuedTime.Equal(at), "enqueued at the scheduled time, got %v", msg.EnqueuedTime)
		require.NoError(t, receiver.CompleteMessage(ctxT(t), msg, nil))
	})

	t.Run("lock expires", func(t *testing.T) {
		fake := newFakeClock(start)
		em := startEmulator(t, Config{Clock: fake, Queues: []broker.QueueConfig{{Name: "q", LockDuration: 30 * time.Second}}})
		client := newClient(t, em)
		sendText(t, newSender(t, client, "q"), "slow")
		receiver := newReceiver(t, client, "q", nil)

		first := receiveOne(t, receiver)
		require.NotNil(t, first.LockedUntil)
		assert.True(t, first.LockedUntil.Equal(start.Add(30*time.Second)), "locked until %v", first.LockedUntil)

		received := make(chan *azservicebus.ReceivedMessage)
		go func() {
			msgs, err := receiver.ReceiveMessages(ctxT(t), 1, nil)
			assert.NoError(t, err)
			assert.Len(t, msgs, 1)
			received <- msgs[0]
		}()
		waitFor(t, func() bool { return em.receiversWaiting() == 1 })
		fake.Advance(30 * time.Second)

		second := <-received
		assert.Equal(t, "slow", string(second.Body))
		assert.Equal(t, uint32(2), second.DeliveryCount)
		requireCode(t, receiver.CompleteMessage(ctxT(t), first, nil), azservicebus.CodeLockLost)
		require.NoError(t, receiver.CompleteMessage(ctxT(t), second, nil))
	})

	t.Run("time to live lapses", func(t *testing.T) {
		fake := newFakeClock(start)
		em := startEmulator(t, Config{Clock: fake, Queues: []broker.QueueConfig{{Name: "q", DeadLetterOnExpiration: true}}})
		client := newClient(t, em)
		sender := newSender(t, client, "q")
		require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("stale"), TimeToLive: to.Ptr(10 * time.Minute)}, nil))

		dlq := newReceiver(t, client, "q", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
		received := make(chan *azservicebus.ReceivedMessage)
		go func() {
			msgs, err := dlq.ReceiveMessages(ctxT(t), 1, nil)
			assert.NoError(t, err)
			assert.Len(t, msgs, 1)
			received <- msgs[0]
		}()
		waitFor(t, func() bool { return em.receiversWaiting() == 1 })
		fake.Advance(10 * time.Minute)

		dead := <-received
		assert.Equal(t, "stale", string(dead.Body))
		require.NotNil(t, dead.DeadLetterReason)
		assert.Equal(t, broker.ReasonTTLExpired, *dead.DeadLetterReason)
		q, _ := em.Broker().Queue("q")
		assert.Equal(t, broker.Stats{Locked: 0, DeadLettered: 1}, q.Stats())
	})
}
