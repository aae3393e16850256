package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/retrytest"
)

// Testing an ordered handler: a session consumer with durable holds on retrytest's broker and a mock
// clock. "paid" fails once; its session is held in the broker (the message deferred, "shipped" deferred
// behind it, a wake-up scheduled) and gives its place to the other session. Moving the clock to the wake-up
// runs "paid" again, then "shipped": the order of each session holds, and the hour takes no real time.
func ExampleSessionConsumer_durableHolds() {
	mock := clock.NewMock()
	b, err := retrytest.New(mock, &retrytest.BrokerOptions{RequiresSession: true})
	if err != nil {
		panic(err)
	}
	for _, m := range [][2]string{{"order-1", "created"}, {"order-1", "paid"}, {"order-2", "created"}, {"order-1", "shipped"}} {
		if _, err := b.Send(&azservicebus.Message{SessionID: &m[0], Body: []byte(m[1])}); err != nil {
			panic(err)
		}
	}
	done := make(chan string, 8)
	failed := false
	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		sid, _ := retry.SessionIDFromContext(ctx)
		if string(msg.Body) == "paid" && !failed {
			failed = true
			return errors.New("payment service unavailable")
		}
		done <- sid + ": " + string(msg.Body)
		return nil
	}
	sc, err := retry.NewSessionConsumer(b.SessionConnector(), handler,
		&retry.Options{Clock: mock, Backoff: backoff.Constant{Interval: time.Hour}, Logger: discardLogger()},
		&retry.SessionOptions{MaxConcurrentSessions: 1, MaxHold: time.Minute, DurableHolds: true})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- sc.Run(ctx) }()

	wait := func(cond func() bool) {
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.WaitUntil(wctx, cond); err != nil {
			panic(err)
		}
	}
	// advance moves the mock clock on by step until cond holds: the consumer arms its timers (the idle
	// wait, the receive's) when it gets there, which a single jump could overtake.
	advance := func(step time.Duration, cond func() bool) {
		for range 1000 {
			if cond() {
				return
			}
			mock.Add(step)
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			_ = b.WaitUntil(wctx, cond)
			cancel()
		}
		panic("the consumer did not get there")
	}
	// order-1 is held: "paid" and "shipped" are deferred. Once order-1 is idle for SessionIdleTimeout
	// (10 s) its place goes to order-2, which runs meanwhile.
	wait(func() bool { return len(b.Deferred()) == 2 })
	advance(time.Second, func() bool { return len(done) == 2 })
	fmt.Println(<-done)
	fmt.Println(<-done)
	advance(time.Minute, func() bool { return len(done) == 2 }) // to the wake-up, an hour on
	fmt.Println(<-done)
	fmt.Println(<-done)
	stop()
	if err := <-ran; err != nil {
		panic(err)
	}
	fmt.Println("deferred:", sc.Health().Deferred)
	// Output:
	// order-1: created
	// order-2: created
	// order-1: paid
	// order-1: shipped
	// deferred: 2
}
