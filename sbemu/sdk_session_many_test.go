package sbemu

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// drainSessions runs receivers goroutines, each accepting the next
// available session of ent until every one of sessions sessions was
// drained of its perSession messages (completing each), and returns the
// bodies received per session, in order. A session is accepted as a
// whole: each receiver takes all of its messages and closes it.
func drainSessions(tb testing.TB, ctx context.Context, client *azservicebus.Client, ent sessionEntity, sessions, perSession, receivers int) map[string][]string {
	tb.Helper()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		mu      sync.Mutex
		got     = make(map[string][]string, sessions)
		drained int
		wg      sync.WaitGroup
		errs    = make(chan error, receivers)
	)
	for range receivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				r, err := ent.accept(ctx, client, nil)
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("accepting the next session: %w", err)
						stop()
					}
					return
				}
				var bodies []string
				for len(bodies) < perSession && err == nil {
					var msgs []*azservicebus.ReceivedMessage
					msgs, err = r.ReceiveMessages(ctx, perSession-len(bodies), nil)
					for _, m := range msgs {
						bodies = append(bodies, string(m.Body))
						if err == nil {
							err = r.CompleteMessage(ctx, m, nil)
						}
					}
				}
				_ = r.Close(context.WithoutCancel(ctx))
				if err != nil {
					errs <- fmt.Errorf("session %s: %w", r.SessionID(), err)
					stop()
					return
				}
				mu.Lock()
				got[r.SessionID()] = append(got[r.SessionID()], bodies...)
				drained++
				if drained == sessions {
					stop() // the other receivers wait for a session no more
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(tb, err)
	}
	return got
}

// sendToSessions sends perSession messages to each of sessions sessions
// ("s0", "s1", ...), bodies "<session>/<i>" in order within each session,
// from 8 goroutines over one link.
func sendToSessions(tb testing.TB, ctx context.Context, sender *azservicebus.Sender, sessions, perSession int) {
	tb.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := w; s < sessions; s += 8 {
				id := fmt.Sprintf("s%d", s)
				for i := range perSession {
					m := &azservicebus.Message{Body: fmt.Appendf(nil, "%s/%d", id, i), SessionID: to.Ptr(id)}
					if err := sender.SendMessage(ctx, m, nil); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(tb, err)
	}
}

// TestSDKManySessionsFewReceivers: 1,000 sessions on a queue and on a
// subscription, drained by 4 receivers that each accept the next available
// session in turn: every session is accepted once, every message arrives
// once, in send order within its session.
func TestSDKManySessionsFewReceivers(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 sessions")
	}
	const sessions, perSession, receivers = 1000, 3, 4
	forEachSessionEntity(t, nil, func(t *testing.T, em *Emulator, ent sessionEntity) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		client := newClient(t, em)
		sendToSessions(t, ctx, newSender(t, client, ent.sendTo), sessions, perSession)
		got := drainSessions(t, ctx, client, ent, sessions, perSession, receivers)
		require.Len(t, got, sessions)
		for s := range sessions {
			id := fmt.Sprintf("s%d", s)
			want := make([]string, perSession)
			for i := range want {
				want[i] = fmt.Sprintf("%s/%d", id, i)
			}
			assert.Equal(t, want, got[id])
		}
		assert.Zero(t, ent.broker(em).Stats())
	})
}
