package retrytest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// One model, two doors: every scenario below runs once through retrytest's Broker and once through the
// real azservicebus SDK against the emulator on loopback, and must produce the same outcome, which
// must also be the outcome written in the scenario (so that a door agreeing with a wrong other door
// still fails). Both doors are configured from the same broker configuration and driven by their own
// mock clock starting at the same instant.

// parityTimeout bounds every SDK call; the retrytest door never waits that long.
const parityTimeout = 20 * time.Second

// door is what a scenario can do with an entity, whichever way it is reached.
type door interface {
	// send publishes m, as a producer's SendMessage.
	send(t *testing.T, m *azservicebus.Message) error
	// schedule schedules m for at, as ScheduleMessages, and returns its sequence number.
	schedule(t *testing.T, m *azservicebus.Message, at time.Time) (int64, error)
	// receiver is the (one, cached) peek-lock receiver of sub, or of the queue when sub is "".
	receiver(t *testing.T, sub string) retry.Receiver
	// deadLetters receives and completes everything in the dead-letter queue of sub (or the queue).
	deadLetters(t *testing.T, sub string) []deadLetter
	// counts reports the receivable and the scheduled messages of the whole entity.
	counts(t *testing.T) counts
	// advance moves the door's clock.
	advance(d time.Duration)
}

type counts struct{ Available, Scheduled int }

// deadLetter is what a scenario observes of a dead-lettered message.
type deadLetter struct {
	Body, Reason, Description, Source string
}

// entity is a scenario's configuration: a queue, or a topic with subscriptions, and then possibly the
// retry queue of its first subscription (the layout of retry.Namespace.Subscription). The retry
// queue's settings must be those retrytest gives it: the first subscription's lock duration and
// MaxDeliveryCount, the topic's duplicate detection window.
type entity struct {
	queue      *broker.QueueConfig
	topic      *broker.TopicConfig
	retryQueue *broker.QueueConfig
}

// layoutDoor is a door on the subscription layout: besides the topic and its subscriptions, the first
// subscription's retry queue, and the door's clock for a retry.Processor.
type layoutDoor interface {
	door
	// retrySender schedules to the retry queue.
	retrySender(t *testing.T) retry.Sender
	// retryReceiver is the (one, cached) peek-lock receiver of the retry queue.
	retryReceiver(t *testing.T) retry.Receiver
	// retryDeadLetters receives and completes everything in the retry queue's dead-letter queue.
	retryDeadLetters(t *testing.T) []deadLetter
	clock() retry.Clock
}

// doorFactory builds a door for an entity with its clock at start.
type doorFactory func(t *testing.T, e entity, start time.Time) door

var doors = []struct {
	name string
	open doorFactory
}{
	{"retrytest", openRetrytestDoor},
	{"sdk+sbemu", openSDKDoor},
}

// parityScenarios are the shared table. Each run returns a value that captures everything observable
// the scenario cares about; want is that value.
var parityScenarios = []struct {
	name   string
	entity entity
	run    func(t *testing.T, d door) any
	want   any
}{
	{
		name:   "TTL expiry dead-letters with DeadLetterOnExpiration",
		entity: entity{queue: &broker.QueueConfig{Name: "ttl", DeadLetterOnExpiration: true}},
		run:    runTTLExpiry,
		want:   ttlOutcome{Received: []string{"lives"}, Dead: []deadLetter{{Body: "dies", Reason: broker.ReasonTTLExpired, Description: "The message expired and was dead lettered.", Source: "ttl"}}},
	},
	{
		name:   "TTL expiry drops without DeadLetterOnExpiration",
		entity: entity{queue: &broker.QueueConfig{Name: "ttl"}},
		run:    runTTLExpiry,
		want:   ttlOutcome{Received: []string{"lives"}},
	},
	{
		name:   "default TTL caps a longer TimeToLive and expires messages without one",
		entity: entity{queue: &broker.QueueConfig{Name: "capped", DefaultTTL: time.Minute}},
		run:    runDefaultTTL,
		want:   defaultTTLOutcome{TimeToLive: time.Minute, Left: counts{}},
	},
	{
		name:   "duplicate detection inside and after the window",
		entity: entity{queue: &broker.QueueConfig{Name: "dedup", DuplicateDetectionWindow: time.Minute}},
		run:    runDuplicateWindow,
		want:   []string{"first", "after the window"},
	},
	{
		name:   "oversized message rejected",
		entity: entity{queue: &broker.QueueConfig{Name: "small", MaxMessageSize: 4096}},
		run:    runOversized,
		want:   oversizedOutcome{SendTooLarge: true, ScheduleRefused: true, Received: []string{"fits"}},
	},
	{
		name:   "the size limit counts the same bytes",
		entity: entity{queue: &broker.QueueConfig{Name: "exact", MaxMessageSize: 4096}},
		run:    runLargestBody,
		want:   4096 - largestBodyOverhead,
	},
	{
		name:   "MaxDeliveryCount dead-letters after the last lock expires",
		entity: entity{queue: &broker.QueueConfig{Name: "poison", MaxDeliveryCount: 2, LockDuration: 30 * time.Second}},
		run:    runMaxDeliveryCount,
		want: maxDeliveryOutcome{DeliveryCounts: []uint32{1, 2}, Dead: []deadLetter{{Body: "poison", Reason: broker.ReasonMaxDeliveryCountExceeded,
			Description: "Message could not be consumed after 2 delivery attempts.", Source: "poison"}}},
	},
	{
		name:   "scheduled message activates with a new sequence number",
		entity: entity{queue: &broker.QueueConfig{Name: "later"}},
		run:    runScheduledActivation,
		want:   scheduledOutcome{ScheduledSeq: 1, Before: counts{Scheduled: 1}, ReceivedSeq: 2, EnqueuedAtSchedule: true, ScheduledEnqueueTime: true},
	},
	{
		name: "topic fans out to the subscriptions its rules select",
		entity: entity{topic: &broker.TopicConfig{Name: "orders", Subscriptions: []broker.SubscriptionConfig{
			{Name: "all"},
			{Name: "eu", Rules: []broker.RuleConfig{{Name: "eu", SQLFilter: "region = 'eu'"}}},
			{Name: "big", Rules: []broker.RuleConfig{{Name: "big", CorrelationFilter: &broker.CorrelationFilter{Properties: map[string]any{"size": "big"}}}}},
		}}},
		run:  runTopicFanOut,
		want: map[string][]string{"all": {"eu-small", "us-big"}, "eu": {"eu-small"}, "big": {"us-big"}, "left": nil},
	},
	{
		name: "subscription with its retry queue: copies go to the retry queue and dead letters where Service Bus puts them",
		entity: entity{
			topic: &broker.TopicConfig{Name: "orders", DuplicateDetectionWindow: 10 * time.Minute, Subscriptions: []broker.SubscriptionConfig{
				{Name: "billing", LockDuration: 30 * time.Second, MaxDeliveryCount: 5},
				{Name: "audit"},
			}},
			retryQueue: &broker.QueueConfig{Name: "orders-billing-retry", LockDuration: 30 * time.Second, MaxDeliveryCount: 5, DuplicateDetectionWindow: 10 * time.Minute},
		},
		run: runSubscriptionLayout,
		want: layoutOutcome{
			Attempts: map[string][]string{
				"flaky":   {"orders/Subscriptions/billing #1 retry-scheduled", "orders-billing-retry #2 retry-scheduled", "orders-billing-retry #3 completed"},
				"poison":  {"orders/Subscriptions/billing #1 retry-scheduled", "orders-billing-retry #2 retry-scheduled", "orders-billing-retry #3 dead-lettered"},
				"invalid": {"orders/Subscriptions/billing #1 dead-lettered"},
			},
			CopyLockedFor:    30 * time.Second,
			CopyDelivery:     1,
			Audit:            []string{"flaky", "poison", "invalid"},
			SubscriptionDead: []deadLetter{{Body: "invalid", Reason: "RetryPermanentFailure", Description: "no such customer", Source: "orders/Subscriptions/billing"}},
			RetryQueueDead:   []deadLetter{{Body: "poison", Reason: "RetryMaxAttemptsExceeded", Description: "payment service unavailable", Source: "orders-billing-retry"}},
		},
	},
	{
		name:   "lock expiry redelivers with a higher DeliveryCount",
		entity: entity{queue: &broker.QueueConfig{Name: "locks", LockDuration: 30 * time.Second}},
		run:    runLockExpiry,
		want:   lockOutcome{First: 1, LockedFor: 30 * time.Second, LateSettle: azservicebus.CodeLockLost, Second: 2, SameMessage: true, HasMessageID: true},
	},
}

// TestParityOfDoors runs every scenario through both doors.
func TestParityOfDoors(t *testing.T) {
	start := time.Now().Truncate(time.Second)
	for _, sc := range parityScenarios {
		t.Run(sc.name, func(t *testing.T) {
			got := make([]any, len(doors))
			for i, d := range doors {
				t.Run(d.name, func(t *testing.T) {
					got[i] = sc.run(t, d.open(t, sc.entity, start))
					assert.Equal(t, sc.want, got[i])
				})
			}
			assert.Equal(t, got[0], got[1], "the doors disagree")
		})
	}
}

// --- scenarios ---

type ttlOutcome struct {
	Received []string
	Dead     []deadLetter
}

// runTTLExpiry sends a message with a 10 s TimeToLive and one without, and lets 10 s pass.
func runTTLExpiry(t *testing.T, d door) any {
	require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte("dies"), TimeToLive: ptr(10 * time.Second)}))
	require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte("lives")}))
	d.advance(10 * time.Second)
	return ttlOutcome{Received: drain(t, d, "", d.counts(t).Available), Dead: d.deadLetters(t, "")}
}

type defaultTTLOutcome struct {
	TimeToLive time.Duration // what the receiver sees of a message sent with an hour
	Left       counts        // after the default TTL passed
}

// runDefaultTTL sends a message with a TimeToLive above the queue's default and one without any.
func runDefaultTTL(t *testing.T, d door) any {
	require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte("hour"), TimeToLive: ptr(time.Hour)}))
	require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte("none")}))
	msgs := receive(t, d, "", 1)
	require.NoError(t, d.receiver(t, "").CompleteMessage(ctx(t), msgs[0], nil))
	d.advance(time.Minute)
	return defaultTTLOutcome{TimeToLive: *msgs[0].TimeToLive, Left: d.counts(t)}
}

// runDuplicateWindow sends one MessageID three times: at once, inside the one-minute window and
// after it.
func runDuplicateWindow(t *testing.T, d door) any {
	id := "order-1"
	require.NoError(t, d.send(t, &azservicebus.Message{MessageID: &id, Body: []byte("first")}))
	d.advance(30 * time.Second)
	require.NoError(t, d.send(t, &azservicebus.Message{MessageID: &id, Body: []byte("inside the window")}), "a duplicate reports success")
	d.advance(31 * time.Second)
	require.NoError(t, d.send(t, &azservicebus.Message{MessageID: &id, Body: []byte("after the window")}))
	return drain(t, d, "", d.counts(t).Available)
}

type oversizedOutcome struct {
	SendTooLarge    bool // the error wraps azservicebus.ErrMessageTooLarge
	ScheduleRefused bool
	Received        []string
}

func runOversized(t *testing.T, d door) any {
	big := []byte(strings.Repeat("x", 8192))
	var out oversizedOutcome
	out.SendTooLarge = errors.Is(d.send(t, &azservicebus.Message{Body: big}), azservicebus.ErrMessageTooLarge)
	_, err := d.schedule(t, &azservicebus.Message{Body: big}, parityStart(d).Add(time.Hour))
	out.ScheduleRefused = err != nil
	require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte("fits")}))
	out.Received = drain(t, d, "", d.counts(t).Available)
	return out
}

// largestBodyOverhead is what the AMQP encoding of runLargestBody's message adds to its body: the
// properties section with its MessageID, an empty annotations section and the data section's header.
// The figure itself matters less than both doors agreeing on it to the byte.
const largestBodyOverhead = 35

// runLargestBody finds the largest body the entity accepts, by bisection.
func runLargestBody(t *testing.T, d door) any {
	id := "m"
	lo, hi := 0, 4096 // lo is accepted, hi is not
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		err := d.send(t, &azservicebus.Message{MessageID: &id, Body: make([]byte, mid)})
		if err == nil {
			lo = mid
			continue
		}
		require.ErrorIs(t, err, azservicebus.ErrMessageTooLarge)
		hi = mid
	}
	return lo
}

type maxDeliveryOutcome struct {
	DeliveryCounts []uint32
	Dead           []deadLetter
}

// runMaxDeliveryCount lets the lock of every delivery expire until the broker gives up.
func runMaxDeliveryCount(t *testing.T, d door) any {
	require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte("poison")}))
	var out maxDeliveryOutcome
	for range 2 {
		msgs := receive(t, d, "", 1)
		out.DeliveryCounts = append(out.DeliveryCounts, msgs[0].DeliveryCount)
		d.advance(30 * time.Second)
	}
	out.Dead = d.deadLetters(t, "")
	return out
}

type scheduledOutcome struct {
	ScheduledSeq         int64
	Before               counts // a second before it is due
	ReceivedSeq          int64
	EnqueuedAtSchedule   bool // EnqueuedTime is the scheduled time
	ScheduledEnqueueTime bool // and so is ScheduledEnqueueTime
}

func runScheduledActivation(t *testing.T, d door) any {
	at := parityStart(d).Add(time.Hour)
	var out scheduledOutcome
	var err error
	out.ScheduledSeq, err = d.schedule(t, &azservicebus.Message{Body: []byte("in an hour")}, at)
	require.NoError(t, err)
	d.advance(time.Hour - time.Second)
	out.Before = d.counts(t)
	d.advance(time.Second)
	msgs := receive(t, d, "", 1)
	out.ReceivedSeq = *msgs[0].SequenceNumber
	out.EnqueuedAtSchedule = msgs[0].EnqueuedTime != nil && msgs[0].EnqueuedTime.Equal(at)
	out.ScheduledEnqueueTime = msgs[0].ScheduledEnqueueTime != nil && msgs[0].ScheduledEnqueueTime.Equal(at)
	require.NoError(t, d.receiver(t, "").CompleteMessage(ctx(t), msgs[0], nil))
	return out
}

func runTopicFanOut(t *testing.T, d door) any {
	require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte("eu-small"), ApplicationProperties: map[string]any{"region": "eu", "size": "small"}}))
	require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte("us-big"), ApplicationProperties: map[string]any{"region": "us", "size": "big"}}))
	out := map[string][]string{"all": drain(t, d, "all", 2), "eu": drain(t, d, "eu", 1), "big": drain(t, d, "big", 1)}
	if n := d.counts(t).Available; n > 0 {
		out["left"] = []string{"more copies than the rules select"}
	} else {
		out["left"] = nil
	}
	return out
}

type lockOutcome struct {
	First        uint32
	LockedFor    time.Duration
	LateSettle   azservicebus.Code
	Second       uint32
	SameMessage  bool // same MessageID and SequenceNumber
	HasMessageID bool // the broker assigned one, as Service Bus does
}

func runLockExpiry(t *testing.T, d door) any {
	require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte("slow")}))
	r := d.receiver(t, "")
	first := receive(t, d, "", 1)[0]
	out := lockOutcome{First: first.DeliveryCount, LockedFor: first.LockedUntil.Sub(*first.EnqueuedTime)}
	d.advance(30 * time.Second)
	var sbErr *azservicebus.Error
	if errors.As(r.CompleteMessage(ctx(t), first, nil), &sbErr) {
		out.LateSettle = sbErr.Code
	}
	second := receive(t, d, "", 1)[0]
	out.Second = second.DeliveryCount
	out.SameMessage = second.MessageID == first.MessageID && *second.SequenceNumber == *first.SequenceNumber
	out.HasMessageID = first.MessageID != ""
	require.NoError(t, r.CompleteMessage(ctx(t), second, nil))
	return out
}

type layoutOutcome struct {
	Attempts         map[string][]string // by body: "entity #attempt outcome"
	CopyLockedFor    time.Duration       // a retry copy's lock, received from the retry queue
	CopyDelivery     uint32              // and its DeliveryCount
	Audit            []string            // what the other subscription got
	AuditCopies      int                 // retry copies among them
	SubscriptionDead []deadLetter
	RetryQueueDead   []deadLetter
	Left             counts
}

// runSubscriptionLayout runs a retry.Processor on the first subscription with the retry queue as its
// sender, the way retry.Namespace.Subscription connects a consumer: a message that succeeds at its
// third attempt, one that fails every attempt, and one refused for good at its first.
func runSubscriptionLayout(t *testing.T, d door) any {
	ld := d.(layoutDoor)
	const sub = "billing"
	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		switch {
		case string(msg.Body) == "invalid":
			return retry.Permanent(errors.New("no such customer"))
		case string(msg.Body) == "poison", env.Attempt < 3:
			return errors.New("payment service unavailable")
		}
		return nil
	}
	out := layoutOutcome{Attempts: map[string][]string{}}
	p, err := retry.NewProcessor(ld.retrySender(t), handler, &retry.Options{
		MaxAttempts: 3, Backoff: backoff.Constant{Interval: 10 * time.Second}, Clock: ld.clock(),
		EntityPath: broker.SubscriptionPath("orders", sub), Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	for _, body := range []string{"flaky", "poison", "invalid"} {
		require.NoError(t, d.send(t, &azservicebus.Message{Body: []byte(body)}))
	}
	process := func(r retry.Receiver, entity string, n int) {
		for got := 0; got < n; {
			msgs, err := r.ReceiveMessages(ctx(t), n-got, nil)
			require.NoError(t, err)
			for _, m := range msgs {
				if entity != broker.SubscriptionPath("orders", sub) {
					out.CopyLockedFor, out.CopyDelivery = m.LockedUntil.Sub(*m.EnqueuedTime), m.DeliveryCount
				}
				res := p.Process(ctx(t), r, m)
				body := string(m.Body)
				out.Attempts[body] = append(out.Attempts[body], fmt.Sprintf("%s #%d %s", entity, res.Attempt, res.Outcome))
			}
			got += len(msgs)
		}
	}
	process(d.receiver(t, sub), broker.SubscriptionPath("orders", sub), 3)
	for range 2 {
		d.advance(10 * time.Second)
		process(ld.retryReceiver(t), "orders-billing-retry", 2)
	}
	for len(out.Audit) < 3 {
		for _, m := range receive(t, d, "audit", 3-len(out.Audit)) {
			out.Audit = append(out.Audit, string(m.Body))
			if _, ok := m.ApplicationProperties[envelope.PropAttempt]; ok {
				out.AuditCopies++
			}
			require.NoError(t, d.receiver(t, "audit").CompleteMessage(ctx(t), m, nil))
		}
	}
	out.SubscriptionDead = d.deadLetters(t, sub)
	out.RetryQueueDead = ld.retryDeadLetters(t)
	out.Left = d.counts(t)
	return out
}

// --- helpers shared by the scenarios ---

func ptr[T any](v T) *T { return &v }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), parityTimeout)
	t.Cleanup(cancel)
	return c
}

// receive takes at least one and at most n messages from sub.
func receive(t *testing.T, d door, sub string, n int) []*azservicebus.ReceivedMessage {
	t.Helper()
	msgs, err := d.receiver(t, sub).ReceiveMessages(ctx(t), n, nil)
	require.NoError(t, err)
	require.NotEmpty(t, msgs)
	return msgs
}

// drain receives and completes n messages of sub and returns their bodies in order.
func drain(t *testing.T, d door, sub string, n int) []string {
	t.Helper()
	var bodies []string
	for len(bodies) < n {
		for _, m := range receive(t, d, sub, n-len(bodies)) {
			bodies = append(bodies, string(m.Body))
			require.NoError(t, d.receiver(t, sub).CompleteMessage(ctx(t), m, nil))
		}
	}
	return bodies
}

// parityStart is the instant the door's clock started at.
func parityStart(d door) time.Time {
	switch d := d.(type) {
	case *retrytestDoor:
		return d.start
	case *sdkDoor:
		return d.start
	}
	panic("unknown door")
}

// --- the retrytest door ---

type retrytestDoor struct {
	b          *retrytest.Broker
	mock       *clock.Mock
	start      time.Time
	retryQueue string // "" without one
	receivers  map[string]retry.Receiver
}

// openRetrytestDoor configures a Broker with the entity's settings, through BrokerOptions.
func openRetrytestDoor(t *testing.T, e entity, start time.Time) door {
	mock := clock.NewMock()
	mock.Set(start)
	var opts retrytest.BrokerOptions
	if q := e.queue; q != nil {
		opts = retrytest.BrokerOptions{
			EntityPath: q.Name, LockDuration: q.LockDuration, MaxDeliveryCount: q.MaxDeliveryCount,
			DuplicateDetectionWindow: q.DuplicateDetectionWindow, DefaultMessageTimeToLive: q.DefaultTTL,
			DeadLetteringOnMessageExpiration: q.DeadLetterOnExpiration, MaxMessageSize: q.MaxMessageSize,
			RequiresSession: q.RequiresSession,
		}
	} else {
		tc := e.topic
		opts = retrytest.BrokerOptions{
			EntityPath: tc.Name, DuplicateDetectionWindow: tc.DuplicateDetectionWindow,
			DefaultMessageTimeToLive: tc.DefaultTTL, MaxMessageSize: tc.MaxMessageSize, Subscriptions: tc.Subscriptions,
		}
	}
	if rq := e.retryQueue; rq != nil {
		opts.EntityPath = broker.SubscriptionPath(e.topic.Name, e.topic.Subscriptions[0].Name)
		opts.RetryQueue = rq.Name
	}
	b, err := retrytest.New(mock, &opts)
	require.NoError(t, err)
	d := &retrytestDoor{b: b, mock: mock, start: start, receivers: map[string]retry.Receiver{}}
	if e.retryQueue != nil {
		d.retryQueue = e.retryQueue.Name
	}
	return d
}

func (d *retrytestDoor) send(_ *testing.T, m *azservicebus.Message) error {
	_, err := d.b.Send(m)
	return err
}

func (d *retrytestDoor) schedule(t *testing.T, m *azservicebus.Message, at time.Time) (int64, error) {
	seqs, err := d.b.Sender().ScheduleMessages(ctx(t), []*azservicebus.Message{m}, at, nil)
	if err != nil {
		return 0, err
	}
	return seqs[0], nil
}

func (d *retrytestDoor) receiver(t *testing.T, sub string) retry.Receiver {
	if r, ok := d.receivers[sub]; ok {
		return r
	}
	r := d.b.Receiver()
	if sub != "" {
		var err error
		r, err = d.b.SubscriptionReceiver(sub)
		require.NoError(t, err)
	}
	d.receivers[sub] = r
	return r
}

// deadLetters lists the dead letters of sub (a subscription's name, "" for the queue, or a retry
// queue's path).
func (d *retrytestDoor) deadLetters(_ *testing.T, sub string) []deadLetter {
	var out []deadLetter
	for _, dl := range d.b.DeadLettered() {
		if sub != "" && dl.Entity != sub && !strings.HasSuffix(strings.ToLower(dl.Entity), strings.ToLower(broker.SubscriptionsSegment+sub)) {
			continue
		}
		out = append(out, deadLetter{Body: string(dl.Message.Body), Reason: dl.Reason, Description: dl.Description, Source: *dl.Message.DeadLetterSource})
	}
	return out
}

func (d *retrytestDoor) retrySender(*testing.T) retry.Sender { return d.b.Sender() }

func (d *retrytestDoor) retryReceiver(t *testing.T) retry.Receiver {
	if r, ok := d.receivers[d.retryQueue]; ok {
		return r
	}
	r, err := d.b.RetryQueueReceiver()
	require.NoError(t, err)
	d.receivers[d.retryQueue] = r
	return r
}

func (d *retrytestDoor) retryDeadLetters(t *testing.T) []deadLetter {
	return d.deadLetters(t, d.retryQueue)
}

func (d *retrytestDoor) clock() retry.Clock { return d.mock }

func (d *retrytestDoor) counts(*testing.T) counts {
	st := d.b.Stats()
	return counts{Available: st.Active, Scheduled: st.Pending}
}

func (d *retrytestDoor) advance(dur time.Duration) { d.mock.Add(dur) }

// --- the SDK door: azservicebus against the emulator on loopback ---

type sdkDoor struct {
	em         *sbemu.Emulator
	client     *azservicebus.Client
	mock       *clock.Mock
	start      time.Time
	name       string // the queue or topic
	topic      bool
	subs       []string
	retryQueue string // "" without one
	sender     *azservicebus.Sender
	retrySend  *azservicebus.Sender
	receivers  map[string]*azservicebus.Receiver
}

func openSDKDoor(t *testing.T, e entity, start time.Time) door {
	mock := clock.NewMock()
	mock.Set(start)
	cfg := sbemu.Config{Clock: mock}
	d := &sdkDoor{mock: mock, start: start, receivers: map[string]*azservicebus.Receiver{}}
	if e.queue != nil {
		cfg.Queues = []broker.QueueConfig{*e.queue}
		d.name = e.queue.Name
	} else {
		cfg.Topics = []broker.TopicConfig{*e.topic}
		d.name, d.topic = e.topic.Name, true
		for _, s := range e.topic.Subscriptions {
			d.subs = append(d.subs, s.Name)
		}
	}
	if rq := e.retryQueue; rq != nil {
		cfg.Queues = append(cfg.Queues, *rq)
		d.retryQueue = rq.Name
	}
	d.em = sbemu.StartT(t, cfg)
	client, err := azservicebus.NewClientFromConnectionString(d.em.ConnectionString(), &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: 2, RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 200 * time.Millisecond},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, client.Close(context.Background())) })
	d.client = client
	d.sender, err = client.NewSender(d.name, nil)
	require.NoError(t, err)
	if d.retryQueue != "" {
		d.retrySend, err = client.NewSender(d.retryQueue, nil)
		require.NoError(t, err)
	}
	return d
}

func (d *sdkDoor) send(t *testing.T, m *azservicebus.Message) error {
	return d.sender.SendMessage(ctx(t), m, nil)
}

func (d *sdkDoor) schedule(t *testing.T, m *azservicebus.Message, at time.Time) (int64, error) {
	seqs, err := d.sender.ScheduleMessages(ctx(t), []*azservicebus.Message{m}, at, nil)
	if err != nil {
		return 0, err
	}
	return seqs[0], nil
}

func (d *sdkDoor) receiver(t *testing.T, sub string) retry.Receiver {
	return d.sdkReceiver(t, sub, nil)
}

// sdkReceiver is the cached receiver of sub: a subscription's name, "" for the queue, or the retry
// queue's name; of its dead-letter queue with opts.
func (d *sdkDoor) sdkReceiver(t *testing.T, sub string, opts *azservicebus.ReceiverOptions) *azservicebus.Receiver {
	key := sub
	if opts != nil {
		key += "/$dlq"
	}
	if r, ok := d.receivers[key]; ok {
		return r
	}
	var r *azservicebus.Receiver
	var err error
	switch {
	case sub == "":
		r, err = d.client.NewReceiverForQueue(d.name, opts)
	case sub == d.retryQueue:
		r, err = d.client.NewReceiverForQueue(d.retryQueue, opts)
	default:
		r, err = d.client.NewReceiverForSubscription(d.name, sub, opts)
	}
	require.NoError(t, err)
	d.receivers[key] = r
	return r
}

// path is the entity path of sub: the queue, a subscription or the retry queue.
func (d *sdkDoor) path(sub string) string {
	switch sub {
	case "":
		return d.name
	case d.retryQueue:
		return d.retryQueue
	}
	return broker.SubscriptionPath(d.name, sub)
}

func (d *sdkDoor) deadLetters(t *testing.T, sub string) []deadLetter {
	dlq, ok := d.em.Broker().Queue(d.path(sub) + broker.DeadLetterSuffix)
	require.True(t, ok)
	n := dlq.Stats().Active
	if n == 0 {
		return nil
	}
	r := d.sdkReceiver(t, sub, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	var out []deadLetter
	for len(out) < n {
		msgs, err := r.ReceiveMessages(ctx(t), n-len(out), nil)
		require.NoError(t, err)
		for _, m := range msgs {
			out = append(out, deadLetter{Body: string(m.Body), Reason: deref(m.DeadLetterReason), Description: deref(m.DeadLetterErrorDescription), Source: deref(m.DeadLetterSource)})
			require.NoError(t, r.CompleteMessage(ctx(t), m, nil))
		}
	}
	return out
}

func (d *sdkDoor) counts(t *testing.T) counts {
	var c counts
	paths := []string{d.name}
	if d.topic {
		paths = paths[:0]
		for _, s := range d.subs {
			paths = append(paths, d.path(s))
		}
		topic, _ := d.em.Broker().Queue(d.name)
		c.Scheduled += topic.Stats().Scheduled
		if d.retryQueue != "" {
			paths = append(paths, d.retryQueue)
		}
	}
	for _, p := range paths {
		q, ok := d.em.Broker().Queue(p)
		require.True(t, ok)
		st := q.Stats()
		c.Available += st.Active
		c.Scheduled += st.Scheduled
	}
	return c
}

func (d *sdkDoor) advance(dur time.Duration) { d.mock.Add(dur) }

func (d *sdkDoor) retrySender(*testing.T) retry.Sender { return d.retrySend }

func (d *sdkDoor) retryReceiver(t *testing.T) retry.Receiver {
	return d.sdkReceiver(t, d.retryQueue, nil)
}

func (d *sdkDoor) retryDeadLetters(t *testing.T) []deadLetter { return d.deadLetters(t, d.retryQueue) }

func (d *sdkDoor) clock() retry.Clock { return d.mock }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
