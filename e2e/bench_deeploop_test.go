//go:build !live

package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// deepLoopGatherWindow and deepLoopSettleAllowance are the consumer's gatherWindow and
// extraSettleSlots (slots.go), which this baseline copies so that it pipelines as the consumer does.
const (
	deepLoopGatherWindow    = 2 * time.Millisecond
	deepLoopSettleAllowance = 64
)

// runDeepLoop is loop-deep of BenchmarkPaired: a hand-written loop that pipelines as deeply as
// retry.Consumer with its defaults, so that the ratio against it is the library's own cost and not
// the depth of its receives. It does what the consumer does, by the plainest means, and nothing the
// consumer could not:
//
//   - one receive goroutine takes one free handler slot (of concurrency) or prefetch place (of
//     concurrency, the consumer's default Prefetch), waiting if none is free, then every other one free
//     now, up to 2 × concurrency (the consumer's default ReceiveBatchSize);
//   - while messages received ahead wait for a handler slot and fewer than half a batch is held, it
//     waits up to 2 ms (the consumer's gatherWindow) for more prefetch places;
//   - it asks for that many with TimeAfterFirstMessage 1 ms (the consumer's receiveOptions) and gives
//     back what the receive did not fill, prefetch places first;
//   - each message runs in a goroutine of its own; one received ahead first waits for a handler slot
//     and then gives its prefetch place back;
//   - after handle, the message takes a settling place (of concurrency + 64, the consumer's
//     extraSettleSlots) if one is free and then gives its handler slot back before the settle, as the
//     consumer does; with none free it settles holding the slot;
//   - settle: handle's error means "schedule copyOf(m) an hour ahead through s, then complete", nil
//     means complete; p.settled after a successful complete.
//
// It renews no lock and logs nothing (the consumer does both), and it checks no remembered outcome.
func runDeepLoop(ctx context.Context, r *azservicebus.Receiver, s *azservicebus.Sender, concurrency int, handle func(context.Context, *azservicebus.ReceivedMessage) error, copyOf func(*azservicebus.ReceivedMessage) *azservicebus.Message, p *pairedImpl) error {
	batch := 2 * concurrency
	slots := make(chan struct{}, concurrency)
	places := make(chan struct{}, concurrency)
	settling := make(chan struct{}, concurrency+deepLoopSettleAllowance)
	var ahead atomic.Int32 // messages received ahead, waiting for a handler slot
	var wg sync.WaitGroup
	defer wg.Wait()
	opts := &azservicebus.ReceiveMessagesOptions{TimeAfterFirstMessage: time.Millisecond}

	run := func(m *azservicebus.ReceivedMessage, holdsPlace bool) {
		defer wg.Done()
		if holdsPlace {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				ahead.Add(-1)
				<-places
				return
			}
			ahead.Add(-1)
			<-places
		}
		err := handle(ctx, m)
		select {
		case settling <- struct{}{}:
			<-slots
			defer func() { <-settling }()
		default:
			defer func() { <-slots }()
		}
		if err != nil {
			if _, err := s.ScheduleMessages(ctx, []*azservicebus.Message{copyOf(m)}, time.Now().Add(time.Hour), nil); err != nil {
				p.failed(err)
				return
			}
		}
		completeAndCount(ctx, r, m, p)
	}

	gather := time.NewTimer(time.Hour) // one timer, stopped between gatherings (Go 1.23 timers: no stale tick)
	gather.Stop()
	for {
		h, pf := 0, 0
		select {
		case slots <- struct{}{}:
			h = 1
		case places <- struct{}{}:
			pf = 1
		case <-ctx.Done():
			return nil
		}
	fill: // handler slots first, then prefetch places
		for h+pf < batch {
			select {
			case slots <- struct{}{}:
				h++
			default:
				break fill
			}
		}
		pf += takeFree(places, batch-h-pf)
		if h+pf < batch/2 && ahead.Load() > 0 {
			gather.Reset(deepLoopGatherWindow)
		wait:
			for h+pf < batch/2 && ahead.Load() > 0 {
				select {
				case places <- struct{}{}:
					pf++
				case <-gather.C:
					break wait
				case <-ctx.Done():
					break wait
				}
			}
			gather.Stop()
			pf += takeFree(places, batch-h-pf)
		}
		n := h + pf
		msgs, err := r.ReceiveMessages(ctx, n, opts)
		for i := len(msgs); i < n; i++ {
			if pf > 0 {
				<-places
				pf--
			} else {
				<-slots
				h--
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for i, m := range msgs {
			holdsPlace := i >= h
			if holdsPlace {
				ahead.Add(1)
			}
			wg.Add(1)
			go run(m, holdsPlace)
		}
	}
}

// takeFree takes up to n free places of sem without waiting and returns how many it took.
func takeFree(sem chan struct{}, n int) int {
	for took := 0; took < n; took++ {
		select {
		case sem <- struct{}{}:
		default:
			return took
		}
	}
	return n
}
