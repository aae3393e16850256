package broker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFIFOAndSequenceNumbers(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	for i := 1; i <= 5; i++ {
		assert.EqualValues(t, i, mustSend(t, q, newMsg(fmt.Sprint(i), fmt.Sprint(i))))
	}
	first := mustReceive(t, q, PeekLock)
	second := mustReceive(t, q, PeekLock)
	assert.EqualValues(t, 1, first.SequenceNumber)
	assert.EqualValues(t, 2, second.SequenceNumber)

	// An abandoned message goes back to its place: it comes before 3.
	require.NoError(t, q.Abandon(first.LockToken, nil))
	var got []int64
	for {
		d, ok := q.TryReceive(ReceiveAndDelete, 1)
		if !ok {
			break
		}
		got = append(got, d.SequenceNumber)
		assert.Equal(t, fmt.Sprint(d.SequenceNumber), body(d))
	}
	assert.Equal(t, []int64{1, 3, 4, 5}, got)
	assert.EqualValues(t, 6, mustSend(t, q, newMsg("6", "6")), "numbers are never reused")
}

func TestSendSizeLimit(t *testing.T) {
	tests := []struct {
		name    string
		limit   int
		size    int
		wantErr error
	}{
		{"default limit, at limit", 0, 256 * 1024, nil},
		{"default limit, over", 0, 256*1024 + 1, ErrMessageTooLarge},
		{"custom limit, under", 10, 9, nil},
		{"custom limit, over", 10, 11, ErrMessageTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := newTestQueue(t, QueueConfig{MaxMessageSize: tt.limit})
			_, _, err := q.Send(newMsg("x", "x"), tt.size)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Equal(t, Stats{}, q.Stats(), "nothing stored")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, Stats{Active: 1}, q.Stats())
		})
	}
}

func TestSendRejects(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	_, _, err := q.Send(nil, 1)
	assert.Error(t, err)
	_, _, err = q.dlq.Send(newMsg("1", "x"), 1)
	assert.ErrorIs(t, err, ErrNotSupported)
	_, err = q.dlq.Schedule(newMsg("1", "x"), 1, time.Unix(100, 0))
	assert.ErrorIs(t, err, ErrNotSupported)
}

func TestTTLExpiry(t *testing.T) {
	withTTL := func(d time.Duration) *amqp.Message {
		m := newMsg("m", "m")
		m.Header = &amqp.MessageHeader{TTL: d}
		return m
	}
	tests := []struct {
		name       string
		cfg        QueueConfig
		msg        *amqp.Message
		expiresIn  time.Duration
		deadLetter bool
	}{
		{"default TTL drops", QueueConfig{DefaultTTL: time.Minute}, newMsg("m", "m"), time.Minute, false},
		{"header TTL overrides default", QueueConfig{DefaultTTL: time.Hour}, withTTL(10 * time.Second), 10 * time.Second, false},
		{"header TTL without default", QueueConfig{}, withTTL(30 * time.Second), 30 * time.Second, false},
		{"header TTL longer than the default is shortened", QueueConfig{DefaultTTL: 10 * time.Second}, withTTL(time.Hour), 10 * time.Second, false},
		{"dead-letter on expiration", QueueConfig{DefaultTTL: time.Minute, DeadLetterOnExpiration: true}, newMsg("m", "m"), time.Minute, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, mock := newTestQueue(t, tt.cfg)
			mustSend(t, q, tt.msg)
			mock.Add(tt.expiresIn - time.Millisecond)
			assert.Equal(t, Stats{Active: 1}, q.Stats(), "alive just before expiry")
			mock.Add(time.Millisecond)
			_, ok := q.TryReceive(PeekLock, 1)
			assert.False(t, ok, "expired")
			if !tt.deadLetter {
				assert.Equal(t, Stats{}, q.Stats())
				return
			}
			assert.Equal(t, Stats{DeadLettered: 1}, q.Stats())
			d := mustReceive(t, q.dlq, PeekLock)
			assert.Equal(t, ReasonTTLExpired, d.Message.ApplicationProperties[PropertyDeadLetterReason])
			assert.Equal(t, "q", d.Message.Annotations[AnnotationDeadLetterSource])
			// Dead-letter queues do not observe TTL.
			require.NoError(t, q.dlq.Abandon(d.LockToken, nil))
			mock.Add(24 * time.Hour)
			assert.Equal(t, Stats{Active: 1}, q.dlq.Stats())
		})
	}
}

func TestTTLShortenedToTheDefaultIsWhatReceiversSee(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{DefaultTTL: time.Minute})
	m := newMsg("m", "m")
	m.Header = &amqp.MessageHeader{TTL: time.Hour}
	mustSend(t, q, m)
	d := mustReceive(t, q, PeekLock)
	assert.Equal(t, time.Minute, d.Message.Header.TTL)
	assert.Equal(t, time.Hour, m.Header.TTL, "the sender's message is not touched")
}

func TestTTLNoExpiryByDefault(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{})
	mustSend(t, q, newMsg("m", "m"))
	mock.Add(365 * 24 * time.Hour)
	assert.Equal(t, Stats{Active: 1}, q.Stats())
}

func TestTTLLockedMessageExpiresWhenReturned(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{DefaultTTL: 10 * time.Second, LockDuration: time.Minute})
	mustSend(t, q, newMsg("m", "m"))
	d := mustReceive(t, q, PeekLock)
	mock.Add(20 * time.Second)
	assert.Equal(t, Stats{Locked: 1}, q.Stats(), "a locked message does not expire")
	require.NoError(t, q.Abandon(d.LockToken, nil))
	assert.Equal(t, Stats{}, q.Stats(), "it expires once returned")
}

func TestTTLWakesDeadLetterReceiver(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{DefaultTTL: time.Minute, DeadLetterOnExpiration: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mustSend(t, q, newMsg("m", "m"))
	ch := receiveAsync(t, ctx, q.dlq, ReceiveAndDelete)
	assertPending(t, ch)
	mock.Add(time.Minute)
	r := await(t, ch)
	require.NoError(t, r.err)
	assert.Equal(t, "m", body(r.d))
}

// TestConcurrentSendersAndReceivers runs 4 senders and 4 receivers over one
// queue: every message must be delivered exactly once when each is completed.
func TestConcurrentSendersAndReceivers(t *testing.T) {
	const senders, receivers, total = 4, 4, 1000
	q, _ := newTestQueue(t, QueueConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		mu   sync.Mutex
		seen = make(map[string]int)
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	for r := range receivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				d, err := q.Receive(ctx, PeekLock, uint64(r))
				if err != nil {
					return
				}
				if err := q.Complete(d.LockToken); err != nil {
					t.Errorf("complete: %v", err)
					return
				}
				mu.Lock()
				seen[body(d)]++
				if len(seen) == total {
					close(done)
				}
				mu.Unlock()
			}
		}()
	}
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range total / senders {
				id := fmt.Sprintf("%d-%d", s, i)
				if _, _, err := q.Send(newMsg(id, id), 10); err != nil {
					t.Errorf("send: %v", err)
				}
			}
		}()
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("not all messages delivered")
	}
	cancel()
	wg.Wait()
	assert.Len(t, seen, total)
	for id, n := range seen {
		assert.Equal(t, 1, n, "message %s", id)
	}
	assert.Equal(t, Stats{}, q.Stats())
}

func BenchmarkSendReceiveComplete(b *testing.B) {
	q, _ := newTestQueue(b, QueueConfig{})
	m := newMsg("id", "payload")
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := q.Send(m, 64); err != nil {
			b.Fatal(err)
		}
		d, ok := q.TryReceive(PeekLock, 1)
		if !ok {
			b.Fatal("no message")
		}
		if err := q.Complete(d.LockToken); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSendOwnedStoresTheMessage: SendOwned and ScheduleOwned store the
// message handed over, with the same semantics as Send and Schedule
// (message id assigned, duplicate detection, scheduling).
func TestSendOwnedStoresTheMessage(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{DuplicateDetectionWindow: time.Minute})
	m := newMsg("a", "one")
	seq, dup, err := q.SendOwned(m, 10)
	require.NoError(t, err)
	require.False(t, dup)
	_, dup, err = q.SendOwned(newMsg("a", "again"), 10)
	require.NoError(t, err)
	assert.True(t, dup, "duplicate detection applies")
	noID := newMsg(nil, "two")
	noID.Properties = nil
	_, _, err = q.SendOwned(noID, 10)
	require.NoError(t, err)
	_, err = q.ScheduleOwned(newMsg("b", "later"), 10, mock.Now().Add(time.Minute))
	require.NoError(t, err)

	d := mustReceive(t, q, PeekLock)
	assert.Equal(t, seq, d.SequenceNumber)
	assert.Equal(t, "one", body(d))
	d = mustReceive(t, q, PeekLock)
	assert.Equal(t, "two", body(d))
	assert.NotNil(t, d.Message.Properties.MessageID, "a message id is assigned")
	assert.Equal(t, Stats{Locked: 2, Scheduled: 1}, q.Stats())
}
