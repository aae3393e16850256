package retrytest_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
	"github.com/sbretry/retry/sbemu/broker"
)

// The README's topic layout: topic orders, the consumed subscription billing with its retry queue, and
// audit, a subscription of another team that must never see a retry.
const (
	billingPath = "orders/Subscriptions/billing"
	billingRQ   = "orders-billing-retry"
)

// newBillingLayout is that layout on clk (nil: the real clock), billing with a 30 s lock.
func newBillingLayout(t *testing.T, clk retry.Clock, opts retrytest.BrokerOptions) *retrytest.Broker {
	t.Helper()
	opts.EntityPath, opts.RetryQueue = billingPath, billingRQ
	if opts.Subscriptions == nil {
		opts.Subscriptions = []broker.SubscriptionConfig{{Name: "billing", LockDuration: 30 * time.Second}, {Name: "audit"}}
	}
	b, err := retrytest.New(clk, &opts)
	require.NoError(t, err)
	return b
}

// sendBodies publishes one message per body, with the body as its MessageID.
func sendBodies(t *testing.T, b *retrytest.Broker, bodies ...string) {
	t.Helper()
	for _, body := range bodies {
		_, err := b.Send(&azservicebus.Message{MessageID: str(body), Body: []byte(body)})
		require.NoError(t, err)
	}
}

// within bounds a test's broker calls: a receive that finds nothing fails the test after 10 s instead
// of waiting for the test binary's timeout.
func within(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A subscription path is an entity path like any other: the broker is that topic with that one
// subscription, Receiver reads it, and its dead letters name it. It was refused ("name must not
// contain '/'").
func TestEntityPathNamesASubscription(t *testing.T) {
	mock := clock.NewMock()
	b, err := retrytest.New(mock, &retrytest.BrokerOptions{EntityPath: billingPath, MaxDeliveryCount: 1})
	require.NoError(t, err)
	sendBodies(t, b, "order-1")
	msgs, err := b.Receiver().ReceiveMessages(within(t), 1, nil)
	require.NoError(t, err)
	assert.Equal(t, "order-1", string(msgs[0].Body))
	_, err = b.SubscriptionReceiver("billing")
	assert.NoError(t, err, "the topic has the subscription")

	mock.Add(retrytest.DefaultLockDuration)
	dl := b.DeadLettered()
	require.Len(t, dl, 1)
	assert.Equal(t, billingPath, dl[0].Entity)
	assert.Equal(t, billingPath, *dl[0].Message.DeadLetterSource)
	assert.Equal(t, broker.ReasonMaxDeliveryCountExceeded, dl[0].Reason)

	// With Subscriptions, the path picks the one Receiver reads (the first by default).
	b, err = retrytest.New(mock, &retrytest.BrokerOptions{EntityPath: "orders/subscriptions/EU", Subscriptions: []broker.SubscriptionConfig{
		{Name: "all"}, {Name: "eu", Rules: []broker.RuleConfig{{Name: "eu", SQLFilter: "region = 'eu'"}}},
	}})
	require.NoError(t, err)
	for _, region := range []string{"us", "eu"} {
		_, err := b.Send(&azservicebus.Message{Body: []byte(region), ApplicationProperties: map[string]any{"region": region}})
		require.NoError(t, err)
	}
	msgs, err = b.Receiver().ReceiveMessages(within(t), 5, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "eu", string(msgs[0].Body))
}

// Sequence numbers are counted per subscription: billing's first message and audit's share number 1.
// A retry scheduled for billing's must not make audit's completion a failed attempt (it did: Retried
// 2, Succeeded 0).
func TestStatsTellSubscriptionsApart(t *testing.T) {
	mock := clock.NewMock()
	b := newBroker(t, mock, &retrytest.BrokerOptions{EntityPath: "orders", Subscriptions: []broker.SubscriptionConfig{{Name: "billing"}, {Name: "audit"}}})
	p, err := retry.NewProcessor(b.Sender(), failFirstAttempts(1), &retry.Options{Clock: mock, EntityPath: billingPath, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	sendBodies(t, b, "order-1")

	billing := b.Receiver()
	msgs, err := billing.ReceiveMessages(within(t), 1, nil)
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeRetryScheduled, p.Process(within(t), billing, msgs[0]).Outcome)
	audit, err := b.SubscriptionReceiver("audit")
	require.NoError(t, err)
	msgs, err = audit.ReceiveMessages(within(t), 1, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, *msgs[0].SequenceNumber)
	require.NoError(t, audit.CompleteMessage(within(t), msgs[0], nil))
	st := b.Stats()
	assert.Equal(t, 1, st.Retried, "billing's failed attempt")
	assert.Equal(t, 1, st.Succeeded, "audit's completion")
}

// failFirstAttempts is a handler that fails the first n attempts of every message.
func failFirstAttempts(n int) retry.Handler {
	return func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		if env, _ := envelope.FromContext(ctx); env.Attempt <= n {
			return errors.New("payment service unavailable")
		}
		return nil
	}
}

// attemptSeen is one delivery as a consumer's OnProcessed hook saw it.
type attemptSeen struct {
	Entity  string
	Attempt int
	Outcome retry.Outcome
	Source  string // the chain's, from the envelope
}

// The layout is one documented set-up: a running Consumer on the broker's Connector receives from the
// subscription and the retry queue, a failed attempt's copy goes to the retry queue (never to audit)
// and comes back from it, the original counts as Retried, and each dead letter lands where Service Bus
// puts it: a first delivery that fails for good in the subscription's dead-letter queue, a message that
// spent its attempts in the retry queue's.
func TestRetryQueueLayoutWithAConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBillingLayout(t, nil, retrytest.BrokerOptions{DuplicateDetection: true})
		var mu sync.Mutex
		seen := map[string][]attemptSeen{}
		handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
			env, _ := envelope.FromContext(ctx)
			switch {
			case msg.MessageID == "invalid":
				return retry.Permanent(errors.New("no such customer"))
			case string(msg.Body) == "poison", env.Attempt < 3:
				return errors.New("payment service unavailable")
			}
			return nil
		}
		c, err := retry.NewConsumer(b.Connector(), handler, &retry.Options{
			MaxAttempts: 3, MaxConcurrency: 2, Backoff: backoff.Constant{Interval: time.Minute}, Logger: slog.New(slog.DiscardHandler),
			Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
				mu.Lock()
				defer mu.Unlock()
				body := string(p.Message.Body)
				seen[body] = append(seen[body], attemptSeen{p.EntityPath, p.Result.Attempt, p.Result.Outcome, p.Envelope.Source})
			}},
		})
		require.NoError(t, err)
		sendBodies(t, b, "flaky", "poison", "invalid")
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()

		wait, stop := context.WithTimeout(t.Context(), time.Hour)
		defer stop()
		require.NoError(t, b.WaitUntil(wait, func() bool { st := b.Stats(); return st.Succeeded == 1 && st.DeadLettered == 2 }))
		synctest.Wait()
		cancel()
		require.NoError(t, <-done)

		assert.Equal(t, retrytest.Stats{Active: 3, Succeeded: 1, Retried: 4, DeadLettered: 2, Scheduled: 4, Connects: 1}, b.Stats(),
			"audit's three copies wait; flaky failed twice and succeeded, poison failed twice and was dead-lettered at its third")
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []attemptSeen{
			{billingPath, 1, retry.OutcomeRetryScheduled, billingPath},
			{billingRQ, 2, retry.OutcomeRetryScheduled, billingPath},
			{billingRQ, 3, retry.OutcomeCompleted, billingPath},
		}, seen["flaky"])
		assert.Equal(t, []attemptSeen{
			{billingPath, 1, retry.OutcomeRetryScheduled, billingPath},
			{billingRQ, 2, retry.OutcomeRetryScheduled, billingPath},
			{billingRQ, 3, retry.OutcomeDeadLettered, billingPath},
		}, seen["poison"])
		assert.Equal(t, []attemptSeen{{billingPath, 1, retry.OutcomeDeadLettered, billingPath}}, seen["invalid"])

		dl := b.DeadLettered()
		require.Len(t, dl, 2)
		assert.Equal(t, "invalid", string(dl[0].Message.Body))
		assert.Equal(t, billingPath, dl[0].Entity)
		assert.Equal(t, "RetryPermanentFailure", dl[0].Reason)
		assert.Equal(t, "poison", string(dl[1].Message.Body))
		assert.Equal(t, billingRQ, dl[1].Entity)
		assert.Equal(t, "RetryMaxAttemptsExceeded", dl[1].Reason)

		audit, err := b.SubscriptionReceiver("audit")
		require.NoError(t, err)
		msgs, err := audit.ReceiveMessages(t.Context(), 10, nil)
		require.NoError(t, err)
		var bodies []string
		for _, m := range msgs {
			bodies = append(bodies, string(m.Body))
			assert.NotContains(t, m.ApplicationProperties, envelope.PropAttempt, "audit never gets a retry copy")
		}
		assert.Equal(t, []string{"flaky", "poison", "invalid"}, bodies)
	})
}

// Step by step with a Processor: Sender schedules to the retry queue, AdvanceToNextScheduled finds the
// copy there, and the copy is received from RetryQueueReceiver only, as a fresh message of the retry
// queue (its own sequence number, first delivery, the subscription's lock duration), while the
// subscription stays empty.
func TestRetryQueueLayoutWithAProcessor(t *testing.T) {
	mock := clock.NewMock()
	b := newBillingLayout(t, mock, retrytest.BrokerOptions{})
	p, err := retry.NewProcessor(b.Sender(), failFirstAttempts(1), &retry.Options{Clock: mock, EntityPath: billingPath, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	sendBodies(t, b, "order-1", "order-2")
	billing := b.Receiver()
	retries, err := b.RetryQueueReceiver()
	require.NoError(t, err)

	msgs, err := billing.ReceiveMessages(within(t), 1, nil)
	require.NoError(t, err)
	res := p.Process(within(t), billing, msgs[0])
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.Equal(t, retrytest.Stats{Active: 3, Pending: 1, Retried: 1, Scheduled: 1}, b.Stats(), "order-2 in billing, both in audit, the copy in the retry queue")

	due, ok := b.AdvanceToNextScheduled(mock)
	require.True(t, ok, "the copy is scheduled in the retry queue")
	assert.Equal(t, res.ScheduledFor, due)
	b.Fail(retrytest.OpReceive, 1, nil) // a fault applies to the retry queue's calls too
	_, err = retries.ReceiveMessages(within(t), 5, nil)
	require.ErrorIs(t, err, retrytest.ErrInjected)
	msgs, err = retries.ReceiveMessages(within(t), 5, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	cp := msgs[0]
	assert.Equal(t, res.RetryMessageID, cp.MessageID)
	assert.EqualValues(t, 1, res.SequenceNumber, "numbered by the retry queue when scheduled")
	assert.EqualValues(t, 2, *cp.SequenceNumber, "and again when it fell due, as on Service Bus")
	assert.Equal(t, uint32(1), cp.DeliveryCount)
	assert.Equal(t, due, *cp.EnqueuedTime)
	assert.Equal(t, 30*time.Second, cp.LockedUntil.Sub(*cp.EnqueuedTime), "locked like the subscription")
	require.Equal(t, retry.OutcomeCompleted, p.Process(within(t), retries, cp).Outcome)

	msgs, err = billing.ReceiveMessages(within(t), 5, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1, "no copy came back through the subscription")
	assert.Equal(t, "order-2", string(msgs[0].Body))
	require.Equal(t, retry.OutcomeRetryScheduled, p.Process(within(t), billing, msgs[0]).Outcome)
	assert.Equal(t, retrytest.Stats{Active: 2, Pending: 1, Succeeded: 1, Retried: 2, Scheduled: 2}, b.Stats())
	assert.Len(t, b.Completed(), 3)
}

// The retry queue is configured like the consumed subscription and shares the topic's duplicate
// detection: a copy whose every lock expires is dead-lettered with MaxDeliveryCountExceeded in the retry
// queue's dead-letter queue, and the copy republished by the redelivery of an original whose complete
// failed is a duplicate there.
func TestRetryQueueFollowsTheSubscriptionsSettings(t *testing.T) {
	mock := clock.NewMock()
	b := newBillingLayout(t, mock, retrytest.BrokerOptions{
		DuplicateDetection: true,
		Subscriptions:      []broker.SubscriptionConfig{{Name: "billing", LockDuration: 20 * time.Second, MaxDeliveryCount: 2}},
	})
	p, err := retry.NewProcessor(b.Sender(), failFirstAttempts(1), &retry.Options{Clock: mock, EntityPath: billingPath, Logger: slog.New(slog.DiscardHandler), DisableLockRenewal: true})
	require.NoError(t, err)
	sendBodies(t, b, "order-1")
	billing := b.Receiver()
	retries, err := b.RetryQueueReceiver()
	require.NoError(t, err)

	// The complete after the schedule fails: the redelivery (another process, say) republishes the
	// same copy, which duplicate detection drops.
	b.Fail(retrytest.OpComplete, 1, nil)
	msgs, err := billing.ReceiveMessages(within(t), 1, nil)
	require.NoError(t, err)
	require.True(t, p.Process(within(t), billing, msgs[0]).PossibleDuplicate)
	mock.Add(20 * time.Second)
	other, err := retry.NewProcessor(b.Sender(), failFirstAttempts(1), &retry.Options{Clock: mock, EntityPath: billingPath, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	msgs, err = billing.ReceiveMessages(within(t), 1, nil)
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeRetryScheduled, other.Process(within(t), billing, msgs[0]).Outcome)
	st := b.Stats()
	assert.Equal(t, 2, st.Scheduled)
	assert.Equal(t, 1, st.Duplicates)
	assert.Equal(t, 1, st.Active, "one copy in the retry queue, due while the original's lock ran out")
	assert.Equal(t, 1, st.Retried)

	for range 2 {
		msgs, err := retries.ReceiveMessages(within(t), 1, nil)
		require.NoError(t, err)
		assert.Equal(t, 20*time.Second, msgs[0].LockedUntil.Sub(mock.Now()), "the subscription's lock duration")
		mock.Add(20 * time.Second) // never settled
	}
	dl := b.DeadLettered()
	require.Len(t, dl, 1)
	assert.Equal(t, billingRQ, dl[0].Entity)
	assert.Equal(t, broker.ReasonMaxDeliveryCountExceeded, dl[0].Reason)
	assert.Equal(t, "Message could not be consumed after 2 delivery attempts.", dl[0].Description, "the subscription's MaxDeliveryCount")
}

// A broker without a retry queue has no retry queue receiver, and says which option gives it one.
func TestRetryQueueReceiverNeedsARetryQueue(t *testing.T) {
	_, err := newBroker(t, clock.NewMock(), &retrytest.BrokerOptions{EntityPath: billingPath}).RetryQueueReceiver()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "BrokerOptions.RetryQueue")
}

// The Connector of the layout is the connection retry.Namespace.Subscription makes: the
// subscription as its receiver, the retry queue as a second source, each named by its entity path, and a
// sender to the retry queue. The consumed subscription is the one EntityPath names, else the first.
func TestRetryQueueConnectorNamesItsEntities(t *testing.T) {
	cases := []struct {
		name string
		opts retrytest.BrokerOptions
	}{
		{"subscription path alone", retrytest.BrokerOptions{EntityPath: billingPath, RetryQueue: billingRQ}},
		{"topic and subscriptions", retrytest.BrokerOptions{EntityPath: "orders", RetryQueue: billingRQ, Subscriptions: []broker.SubscriptionConfig{{Name: "billing"}, {Name: "audit"}}}},
		{"subscription path among subscriptions", retrytest.BrokerOptions{EntityPath: "orders/subscriptions/BILLING", RetryQueue: billingRQ, Subscriptions: []broker.SubscriptionConfig{{Name: "audit"}, {Name: "billing"}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := retrytest.New(clock.NewMock(), &tc.opts)
			require.NoError(t, err)
			conn, err := b.Connector()(within(t))
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, conn.Close(context.Background())) })
			assert.Equal(t, billingPath, conn.EntityPath)
			require.Len(t, conn.Sources, 1)
			assert.Equal(t, billingRQ, conn.Sources[0].EntityPath)

			sendBodies(t, b, "order-1")
			msgs, err := conn.Receiver.ReceiveMessages(within(t), 5, nil)
			require.NoError(t, err)
			require.Len(t, msgs, 1, "the subscription's copy")
			require.NoError(t, conn.Receiver.CompleteMessage(within(t), msgs[0], nil))
			_, err = conn.Sender.ScheduleMessages(within(t), []*azservicebus.Message{{Body: []byte("copy")}}, time.Time{}, nil)
			require.NoError(t, err)
			msgs, err = conn.Sources[0].Receiver.ReceiveMessages(within(t), 5, nil)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			assert.Equal(t, "copy", string(msgs[0].Body), "scheduled to the retry queue")
			assert.Equal(t, 1, b.Stats().Connects)
		})
	}
}
