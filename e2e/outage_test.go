package e2e

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/outage"
)

// outageFor is how long the downstream of TestOutageModeOnTheBroker is down. The figure is two
// minutes (go test ./e2e -run OutageMode -outage 2m); CI runs a shorter outage with the same shape.
var outageFor = flag.Duration("outage", 15*time.Second, "how long the downstream is down in TestOutageModeOnTheBroker")

// receiveCounter counts what the consumer's receives return.
type receiveCounter struct {
	retry.Receiver
	msgs *atomic.Int64
}

func (r receiveCounter) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	msgs, err := r.Receiver.ReceiveMessages(ctx, n, o)
	r.msgs.Add(int64(len(msgs)))
	return msgs, err
}

// countingConnector wraps connect so that every connection's receiver counts into msgs.
func countingConnector(connect retry.Connector, msgs *atomic.Int64) retry.Connector {
	return func(ctx context.Context) (*retry.Connection, error) {
		conn, err := connect(ctx)
		if err != nil {
			return nil, err
		}
		conn.Receiver = receiveCounter{Receiver: conn.Receiver, msgs: msgs}
		return conn, nil
	}
}

// outageEvents records the breaker's changes with their times.
type outageEvents struct {
	received *atomic.Int64 // if set, read at each change
	mu       sync.Mutex
	events   []outageEvent
}

type outageEvent struct {
	at       time.Time
	from, to outage.State
	received int64
}

func (o *outageEvents) hook(p outage.Change) {
	ev := outageEvent{at: p.Time, from: p.From, to: p.To}
	if o.received != nil {
		ev.received = o.received.Load()
	}
	o.mu.Lock()
	o.events = append(o.events, ev)
	o.mu.Unlock()
}

func (o *outageEvents) list() []outageEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]outageEvent(nil), o.events...)
}

// sendSteadily sends n messages named prefix-i at perSecond through the SDK, until n or ctx ends, and
// returns their ids.
func sendSteadily(ctx context.Context, t *testing.T, e *env, prefix string, perSecond int, d time.Duration) []string {
	t.Helper()
	s, err := e.client(t).NewSender(e.queue, nil)
	require.NoError(t, err)
	defer func() { _ = s.Close(context.Background()) }()
	tick := time.NewTicker(time.Second / time.Duration(perSecond))
	defer tick.Stop()
	end := time.Now().Add(d)
	var ids []string
	for time.Now().Before(end) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ids
		}
		id := fmt.Sprintf("%s-%d", prefix, len(ids))
		require.NoError(t, s.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Body: []byte("x")}, nil))
		ids = append(ids, id)
	}
	return ids
}

// The proof, through the SDK on the emulator: a downstream failing 100 % under a steady flow
// (50 messages a second, MaxConcurrency 16) trips the breaker; at most 2 attempts are spent per
// message, nothing is dead-lettered, the consumer receives almost nothing while open, and everything
// succeeds within one probe interval plus the normal backoff of the downstream's recovery.
func TestOutageModeOnTheBroker(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	var down atomic.Bool
	down.Store(true)
	var received atomic.Int64
	var mu sync.Mutex
	lastAttempt := map[string]int{}
	succeeded := map[string]bool{}
	events := outageEvents{received: &received}
	const openFor, maxOpenFor = 2 * time.Second, 4 * time.Second
	backoff := backoff.Fibonacci{Base: time.Second, Floor: time.Second, Cap: 4 * time.Second}
	c := runConsumer(t, countingConnector(e.connector(), &received), func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		mu.Lock()
		lastAttempt[m.MessageID] = max(lastAttempt[m.MessageID], env.Attempt)
		mu.Unlock()
		if down.Load() {
			return errBoom
		}
		mu.Lock()
		succeeded[env.OriginalMessageID] = true
		mu.Unlock()
		return nil
	}, &retry.Options{MaxConcurrency: 16, MaxAttempts: 5, Backoff: backoff, SettleTimeout: 5 * time.Second,
		Outage: &outage.Options{ConsecutiveFailures: 10, OpenFor: openFor, MaxOpenFor: maxOpenFor, Window: 10 * time.Second},
		Hooks:  retry.Hooks{OnOutage: events.hook}})
	waitRunning(t, c)

	// The first second's messages trip it; what the consumer receives after that is counted.
	ids := sendSteadily(t.Context(), t, e, "m", 50, *outageFor)
	evs := events.list()
	require.NotEmpty(t, evs, "the breaker tripped")
	openSince := evs[0].at
	receivedWhileOpen := received.Load() - evs[0].received
	sentWhileOpen := int(time.Since(openSince).Seconds() * 50)

	down.Store(false)
	recovered := time.Now()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(succeeded) == len(ids)
	}, testTimeout, 10*time.Millisecond, "every message succeeds after the recovery")
	took := time.Since(recovered)

	mu.Lock()
	worst := 0
	for _, a := range lastAttempt {
		worst = max(worst, a)
	}
	mu.Unlock()
	h := c.Health()
	t.Logf("outage %s: sent %d (about %d while open), received %d while open, %d held, %d trips, %d probes (%d failed); all succeeded %s after the recovery; worst attempt %d",
		*outageFor, len(ids), sentWhileOpen, receivedWhileOpen, h.Held, h.Outage.Trips, h.Outage.Probes, h.Outage.FailedProbes, took.Round(time.Millisecond), worst)
	assert.LessOrEqual(t, worst, 2, "at most 2 attempts spent per message")
	assert.Zero(t, h.DeadLettered, "nothing dead-lettered")
	q, _ := e.em.Broker().Queue(e.queue)
	assert.Zero(t, q.Stats().DeadLettered)
	assert.Less(t, receivedWhileOpen, int64(len(ids)/20), "the consumer receives almost nothing while open (under 5 %% of what was sent)")
	// One probe interval (at most MaxOpenFor), then the retries' backoff (at most its cap), plus
	// handling: the emulator is fast, so a second covers the rest.
	assert.Less(t, took, maxOpenFor+backoff.Cap+time.Second)
	assert.Equal(t, outage.Closed, h.Outage.State)
}

// A storm of permanent failures of the same size is bad messages, not an outage: it never trips.
func TestPermanentStormDoesNotTripOnTheBroker(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	var events outageEvents
	c := startConsumer(t, e, func(context.Context, *azservicebus.ReceivedMessage) error { return retry.Permanent(errBoom) },
		&retry.Options{MaxConcurrency: 16, Outage: &outage.Options{ConsecutiveFailures: 10, OpenFor: 2 * time.Second}, Hooks: retry.Hooks{OnOutage: events.hook}})
	waitRunning(t, c)
	ids := sendSteadily(t.Context(), t, e, "p", 50, 4*time.Second)
	q, _ := e.em.Broker().Queue(e.queue)
	require.Eventually(t, func() bool { return q.Stats().DeadLettered == len(ids) }, testTimeout, 10*time.Millisecond)
	assert.Empty(t, events.list(), "no trip")
	assert.Zero(t, c.Health().Outage.Trips)
}

// A downstream that flaps (down a second, up a second) does not make the breaker oscillate faster than
// its configured minimum: every opening lasts at least OpenFor, and reopening soon after a close
// doubles the pause.
func TestFlappingDownstreamOnTheBroker(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	var down atomic.Bool
	var events outageEvents
	const openFor = time.Second
	c := startConsumer(t, e, func(context.Context, *azservicebus.ReceivedMessage) error {
		if down.Load() {
			return errBoom
		}
		return nil
	}, &retry.Options{MaxConcurrency: 16, Outage: &outage.Options{ConsecutiveFailures: 5, OpenFor: openFor, MaxOpenFor: 4 * time.Second, Window: 10 * time.Second},
		Hooks: retry.Hooks{OnOutage: events.hook}})
	waitRunning(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		flip := time.NewTicker(time.Second)
		defer flip.Stop()
		for {
			select {
			case <-flip.C:
				down.Store(!down.Load())
			case <-ctx.Done():
				return
			}
		}
	}()
	sendSteadily(ctx, t, e, "f", 50, 12*time.Second)
	cancel()

	evs := events.list()
	var opened time.Time
	trips := 0
	var pauses []time.Duration
	for _, ev := range evs {
		switch {
		case ev.to == outage.Open:
			opened = ev.at
			if ev.from == outage.Closed {
				trips++
			}
		case ev.from == outage.Open && ev.to == outage.HalfOpen:
			pauses = append(pauses, ev.at.Sub(opened))
		}
	}
	t.Logf("12 s of flapping: %d trips, pauses %v", trips, pauses)
	require.NotEmpty(t, pauses, "it tripped and probed")
	for _, p := range pauses {
		assert.GreaterOrEqual(t, p, openFor, "no opening shorter than OpenFor")
	}
	assert.Less(t, trips, 12/int(openFor.Seconds())/2, "fewer trips than flips: the pause doubles while it flaps")
}
