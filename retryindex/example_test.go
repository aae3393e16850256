package retryindex_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryindex"
)

// A consumer keeps the index through its hooks, composed with any others. Compile-only: it needs a
// namespace.
func ExampleRecorder_Hooks() {
	store, err := retryindex.OpenSQLite("/var/lib/billing/retry-index.db", nil)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	rec, err := retryindex.NewRecorder(store, nil)
	if err != nil {
		panic(err)
	}
	// Close the recorder after the consumer's Run returned: it writes what is still queued.
	defer rec.Close(context.Background())
	opts := &retry.Options{Hooks: rec.Hooks(retry.Hooks{})}
	_ = opts // retry.NewConsumer(connect, handler, opts)
}

// Lookup answers for an event by any of its names, with its history and how fresh the answer is.
func ExampleSQLite_Lookup() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	store, err := retryindex.OpenSQLite(filepath.Join(dir, "index.db"), nil)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	env := envelope.Envelope{Source: "orders", FirstSequenceNumber: 7, OriginalMessageID: "order-42"}
	failedAt := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	err = store.Apply(context.Background(), []retryindex.Record{{
		Chain: env.ChainID(), OriginalID: "order-42", Key: "order-42", CorrelationID: "checkout-9", Source: "orders",
		Kind: retryindex.KindScheduled, Attempt: 1, NextAttempt: 2, At: failedAt, NextDue: failedAt.Add(time.Minute),
		Error: "ledger unavailable", Entity: "orders", SequenceNumber: 12, Process: "billing-1", Feed: retryindex.FeedConsumer,
	}})
	if err != nil {
		panic(err)
	}
	ans, err := store.Lookup(context.Background(), "checkout-9", nil)
	if err != nil {
		panic(err)
	}
	for _, e := range ans.Events {
		fmt.Printf("%s: %s, attempt %d due %s (%s)\n", e.OriginalID, e.State, e.Attempt, e.Due.Format(time.TimeOnly), e.LastError)
		for _, h := range e.History {
			fmt.Printf("  attempt %d %s by %s\n", h.Attempt, h.Kind, h.Process)
		}
	}
	fmt.Println(env.RetryMessageID(2) == ans.Events[0].RetryMessageID())
	// Output:
	// order-42: pending, attempt 2 due 10:01:00 (ledger unavailable)
	//   attempt 1 retry scheduled by billing-1
	// true
}
