package broker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// referencePeek is what Peek answered before the indexes: the up to n
// smallest stored sequence numbers from from on (of session when keep
// says so), found by looking at every stored message. b.mu must be held.
func referencePeek(q *Queue, from int64, n int, keep func(*entry) bool) []int64 {
	var seqs []int64
	for e := range q.order.entries() {
		if s := e.seq; s >= from && (keep == nil || keep(e)) {
			seqs = append(seqs, s)
		}
	}
	slices.Sort(seqs)
	return seqs[:min(n, len(seqs))]
}

// referenceNextSession is what AcceptNextSession chose before the ready
// heap: of every session, the free one with the oldest receivable
// message. b.mu must be held.
func referenceNextSession(q *Queue, now time.Time) *sessionState {
	var best *sessionState
	for _, s := range q.sessions {
		if len(s.available) == 0 || !s.free(now) {
			continue
		}
		if best == nil || s.available[0].seq < best.available[0].seq {
			best = s
		}
	}
	return best
}

func seqsOf(ds []*Delivery) []int64 {
	out := []int64{}
	for _, d := range ds {
		out = append(out, d.SequenceNumber)
	}
	return out
}

// checkIndexes compares, on q as it is now, the indexed peek, session
// peek and next free session with the reference walks, and the ready
// heap's bookkeeping with the sessions' states.
func checkIndexes(t *testing.T, q *Queue, rng *rand.Rand, step int) {
	t.Helper()
	b := q.b
	b.mu.Lock()
	last := q.lastSeq
	b.mu.Unlock()
	for range 3 {
		from, n := rng.Int64N(last+2), 1+rng.IntN(8)
		b.mu.Lock()
		q.advance(b.clock.Now())
		want := referencePeek(q, from, n, nil)
		b.mu.Unlock()
		require.Equal(t, append([]int64{}, want...), seqsOf(q.Peek(from, n)), "step %d: peek from %d max %d", step, from, n)
	}
	if !q.sessionful() {
		return
	}
	for range 3 {
		session, from, n := fmt.Sprint("s", rng.IntN(6)), rng.Int64N(last+2), 1+rng.IntN(8)
		b.mu.Lock()
		want := referencePeek(q, from, n, func(e *entry) bool { return e.session == session })
		b.mu.Unlock()
		require.Equal(t, append([]int64{}, want...), seqsOf(q.PeekSession(session, from, n)), "step %d: peek of %s from %d max %d", step, session, from, n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	q.advance(now)
	require.Same(t, referenceNextSession(q, now), q.nextFreeSession(), "step %d: next free session", step)
	ready := 0
	for _, s := range q.sessions {
		want := len(s.available) > 0 && s.holder == 0
		if assert.Equal(t, want, s.readyIndex >= 0, "step %d: session %s in the ready heap", step, s.id) && want {
			assert.Same(t, s, q.ready[s.readyIndex], "step %d: readyIndex of %s", step, s.id)
			ready++
		}
	}
	assert.Len(t, q.ready, ready, "step %d: sessions in the ready heap", step)
}

// TestIndexesMatchReference drives a queue, session-aware or not, through
// random sends, schedules and cancellations, receives in both modes,
// completes, abandons, defers, dead-letters, session accepts, releases,
// lock expiries and time passing, and after every step checks peek,
// session peek and the next free session against the walks they replaced.
func TestIndexesMatchReference(t *testing.T) {
	for _, sessionful := range []bool{false, true} {
		for seed := range uint64(8) {
			t.Run(fmt.Sprintf("sessions=%v/seed=%d", sessionful, seed), func(t *testing.T) {
				runIndexModel(t, sessionful, seed)
			})
		}
	}
}

func runIndexModel(t *testing.T, sessionful bool, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 31))
	q, mock := newTestQueue(t, QueueConfig{RequiresSession: sessionful, LockDuration: 10 * time.Second, MaxDeliveryCount: 3})
	mock.Set(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC))
	var (
		locks     []*SessionLock
		delivered []*Delivery
		scheduled []int64
		deferred  []int64
	)
	message := func(i int) *amqp.Message {
		if sessionful {
			return sessionMsg(fmt.Sprint("s", rng.IntN(6)), fmt.Sprint(i))
		}
		return newMsg(nil, fmt.Sprint(i))
	}
	receive := func(mode Mode) {
		if !sessionful {
			if d, ok := q.TryReceive(mode, 1); ok && mode == PeekLock {
				delivered = append(delivered, d)
			}
			return
		}
		if len(locks) == 0 {
			return
		}
		if d, ok := locks[rng.IntN(len(locks))].TryReceive(mode); ok && mode == PeekLock {
			delivered = append(delivered, d)
		}
	}
	pick := func(list *[]*Delivery) (*Delivery, bool) {
		if len(*list) == 0 {
			return nil, false
		}
		i := rng.IntN(len(*list))
		d := (*list)[i]
		*list = slices.Delete(*list, i, i+1)
		return d, true
	}
	for step := range 400 {
		switch op := rng.IntN(14); op {
		case 0, 1, 2:
			mustSend(t, q, message(step))
		case 3:
			seq, err := q.Schedule(message(step), 100, mock.Now().Add(time.Duration(1+rng.IntN(20))*time.Second))
			require.NoError(t, err)
			scheduled = append(scheduled, seq)
		case 4:
			if len(scheduled) > 0 {
				i := rng.IntN(len(scheduled))
				_ = q.CancelScheduled(scheduled[i]) // it may have activated already
				scheduled = slices.Delete(scheduled, i, i+1)
			}
		case 5:
			receive(PeekLock)
		case 6:
			receive(ReceiveAndDelete)
		case 7:
			if d, ok := pick(&delivered); ok {
				_ = q.Complete(d.LockToken) // its lock may be gone
			}
		case 8:
			if d, ok := pick(&delivered); ok {
				_ = q.Abandon(d.LockToken, nil)
			}
		case 9:
			if d, ok := pick(&delivered); ok {
				if q.Defer(d.LockToken, nil) == nil {
					deferred = append(deferred, d.SequenceNumber)
				}
			}
		case 10:
			if d, ok := pick(&delivered); ok {
				_ = q.DeadLetter(d.LockToken, "r", "d", nil)
			}
		case 11:
			if sessionful && len(locks) < 3 {
				if l, _, err := q.TryAcceptNextSession(uint64(1 + rng.IntN(2))); err == nil && l != nil {
					locks = append(locks, l)
				}
			} else if !sessionful && len(deferred) > 0 {
				i := rng.IntN(len(deferred))
				if ds, err := q.ReceiveDeferred(PeekLock, 1, deferred[i]); err == nil {
					delivered = append(delivered, ds...)
				}
				deferred = slices.Delete(deferred, i, i+1)
			}
		case 12:
			if len(locks) > 0 {
				i := rng.IntN(len(locks))
				locks[i].Release()
				locks = slices.Delete(locks, i, i+1)
			}
		case 13:
			mock.Add(time.Duration(rng.IntN(6000)) * time.Millisecond)
			locks = slices.DeleteFunc(locks, func(l *SessionLock) bool { return !l.Held() })
		}
		checkIndexes(t, q, rng, step)
	}
}
