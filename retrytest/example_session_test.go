package retrytest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"

	"github.com/sbretry/retry/retrytest"
)

// An ordered handler on a session-enabled queue, on a mock clock: a failed message holds its session
// in place (no later message of the session runs) while the session lock is renewed, and is retried
// after a backoff; the other session is untouched. The ten-second holds take no real time.
func ExampleSessionReceiver() {
	mock := clock.NewMock()
	b, err := retrytest.New(mock, &retrytest.BrokerOptions{RequiresSession: true, LockDuration: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	send := func(session, step string) {
		if _, err := b.Send(&azservicebus.Message{SessionID: &session, Body: []byte(step)}); err != nil {
			panic(err)
		}
	}
	send("order-1", "created")
	send("order-2", "created")
	send("order-1", "paid")
	send("order-1", "shipped")

	// The handler under test: "paid" fails twice, as if the payment service were briefly down.
	failures := map[string]int{"paid": 2}
	handle := func(msg *azservicebus.ReceivedMessage) error {
		if failures[string(msg.Body)] > 0 {
			failures[string(msg.Body)]--
			return errors.New("payment service unavailable")
		}
		return nil
	}

	ctx := context.Background()
	for len(b.Sessions()) > 0 {
		r, err := b.AcceptNextSession(ctx) // the session whose first message is oldest
		if err != nil {
			panic(err)
		}
		msgs, err := r.ReceiveMessages(ctx, 10, nil) // what the session has, in order
		if err != nil {
			panic(err)
		}
		for _, msg := range msgs {
			for attempt := 1; handle(msg) != nil; attempt++ {
				fmt.Printf("%s: %s failed (attempt %d), holding the session for 10s\n", r.SessionID(), msg.Body, attempt)
				mock.Add(10 * time.Second)
				// The message locks live under the session lock: renewing it keeps them all.
				if err := r.RenewSessionLock(ctx, nil); err != nil {
					panic(err)
				}
			}
			if err := r.CompleteMessage(ctx, msg, nil); err != nil {
				panic(err)
			}
			fmt.Printf("%s: %s\n", r.SessionID(), msg.Body)
		}
		if err := r.Close(ctx); err != nil {
			panic(err)
		}
	}
	fmt.Println("succeeded:", b.Stats().Succeeded)
	// Output:
	// order-1: created
	// order-1: paid failed (attempt 1), holding the session for 10s
	// order-1: paid failed (attempt 2), holding the session for 10s
	// order-1: paid
	// order-1: shipped
	// order-2: created
	// succeeded: 4
}
