package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/soak/internal/ledger"
)

// producer sends the run's messages, paced over the chaos phase, straight to the emulator (not through
// the proxy: only the consumer's connections are the subject). A failed send is retried with the same
// ids until it succeeds; duplicate detection absorbs a send that reached the broker although it
// reported failure.
type producer struct {
	sender *azservicebus.Sender

	mu      sync.Mutex
	planned map[string]ledger.Expect
	sent    map[string]ledger.Expect
	retries int
}

// plan draws every message's class from r: ids soak-00000, soak-00001, ….
func plan(r *rand.Rand, n, maxFail int) ([]string, map[string]ledger.Expect) {
	ids := make([]string, n)
	out := make(map[string]ledger.Expect, n)
	for i := range n {
		id := fmt.Sprintf("soak-%05d", i)
		c, fail := ledger.IssueMix.Pick(r, maxFail)
		ids[i] = id
		out[id] = ledger.Expect{Class: c, FailAttempts: fail}
	}
	return ids, out
}

// run sends ids in batches every tick so that the last one goes out by until; it gives up on a batch
// only when giveUp passes.
func (p *producer) run(ids []string, until, giveUp time.Time) error {
	const tick = 100 * time.Millisecond
	ticks := max(int(time.Until(until)/tick), 1)
	per := max((len(ids)+ticks-1)/ticks, 1)
	next := time.Now()
	for i := 0; i < len(ids); i += per {
		batch := ids[i:min(i+per, len(ids))]
		if err := p.send(batch, giveUp); err != nil {
			return err
		}
		next = next.Add(tick)
		time.Sleep(time.Until(next))
	}
	return nil
}

// send sends one batch until it succeeds or giveUp passes.
func (p *producer) send(ids []string, giveUp time.Time) error {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := p.sendOnce(ctx, ids)
		cancel()
		if err == nil {
			p.mu.Lock()
			for _, id := range ids {
				p.sent[id] = p.planned[id]
			}
			p.mu.Unlock()
			return nil
		}
		if time.Now().After(giveUp) {
			return fmt.Errorf("sending %s…: %w", ids[0], err)
		}
		p.mu.Lock()
		p.retries++
		p.mu.Unlock()
		time.Sleep(200 * time.Millisecond)
	}
}

func (p *producer) sendOnce(ctx context.Context, ids []string) error {
	batch, err := p.sender.NewMessageBatch(ctx, nil)
	if err != nil {
		return err
	}
	for _, id := range ids {
		e := p.planned[id]
		mid := id
		m := &azservicebus.Message{
			MessageID:             &mid,
			Body:                  []byte(id),
			ApplicationProperties: ledger.Properties(e.Class, e.FailAttempts),
		}
		if e.Session != "" {
			// A sessions run: the batch's order is the session's (batches go out one after the other).
			sid := e.Session
			m.SessionID, m.ApplicationProperties = &sid, ledger.SessionProperties(e)
		}
		if err := batch.AddMessage(m, nil); err != nil {
			return err
		}
	}
	return p.sender.SendMessageBatch(ctx, batch, nil)
}

// result is what was sent and how many batch sends were retried.
func (p *producer) result() (map[string]ledger.Expect, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent, p.retries
}
