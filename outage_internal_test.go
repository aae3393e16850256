package retry

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/outage"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errDown = errors.New("dependency down")

// testBreaker is a breaker on a mock clock that records its hook calls.
type testBreaker struct {
	*breaker
	clk    *clock.Mock
	mu     sync.Mutex
	events []outage.Change
	last   admission // the latest probe admission adm made
}

func newTestBreaker(t *testing.T, o *outage.Options) *testBreaker {
	t.Helper()
	tb := &testBreaker{clk: clock.NewMock()}
	tb.clk.Set(time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC))
	cfg, err := (&Options{Outage: o, Clock: tb.clk, Logger: slog.New(slog.DiscardHandler), Hooks: Hooks{OnOutage: func(p outage.Change) {
		tb.mu.Lock()
		tb.events = append(tb.events, p)
		tb.mu.Unlock()
	}}}).resolve()
	require.NoError(t, err)
	tb.breaker = newBreaker(cfg)
	return tb
}

func (tb *testBreaker) fail(n int) {
	for range n {
		tb.record(admission{kind: admitRun}, attemptFailure, errDown)
	}
}

func (tb *testBreaker) succeed(n int) {
	for range n {
		tb.record(admission{kind: admitRun}, attemptSuccess, nil)
	}
}

func (tb *testBreaker) transitions() []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var out []string
	for _, e := range tb.events {
		out = append(out, e.From.String()+"->"+e.To.String())
	}
	return out
}

func TestBreakerTripsOnConsecutiveFailures(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 5, FailureRate: -1})
	b.fail(4)
	b.succeed(1) // a success breaks the run
	b.fail(4)
	assert.Equal(t, outage.Closed, b.status().State)
	assert.True(t, b.record(admission{kind: admitRun}, attemptFailure, errDown), "the fifth in a row trips it, and that failure is held")
	st := b.status()
	assert.Equal(t, outage.Open, st.State)
	assert.Equal(t, uint64(1), st.Trips)
	assert.Equal(t, b.clk.Now().Add(defaultOutageOpenFor), st.NextProbe)
	assert.Contains(t, st.Reason, "5 failures in a row")
	assert.Contains(t, st.Reason, "dependency down")
	assert.Equal(t, admitHold, b.adm())
	assert.Equal(t, []string{"closed->open"}, b.transitions())
	assert.Equal(t, b.clk.Now(), b.events[0].Time)
}

func TestBreakerTripsOnTheFailureRate(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: -1, FailureRate: 0.5, MinAttempts: 10, Window: time.Minute})
	// Alternating: 50 % failures, but fewer than MinAttempts yet.
	for range 4 {
		b.fail(1)
		b.succeed(1)
	}
	b.fail(1)
	assert.Equal(t, outage.Closed, b.status().State, "9 attempts: below the minimum")
	b.fail(1)
	assert.Equal(t, outage.Open, b.status().State, "6 of 10 failed")
	assert.Contains(t, b.status().Reason, "6 of 10 attempts failed within 1m0s")
}

func TestBreakerRateWindowSlides(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: -1, FailureRate: 0.5, MinAttempts: 10, Window: time.Minute})
	b.fail(9)
	b.clk.Add(61 * time.Second) // those failures leave the window
	b.succeed(9)
	b.fail(1)
	assert.Equal(t, outage.Closed, b.status().State, "1 of 10 within the window")
}

func TestBreakerIgnoresNeutralFailuresAndStops(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 3, FailureRate: -1})
	for range 10 {
		b.record(admission{kind: admitRun}, attemptNeutral, errDown)
		b.record(admission{kind: admitRun}, attemptNone, nil)
	}
	b.fail(2)
	assert.Equal(t, outage.Closed, b.status().State)
}

func TestBreakerHalfOpenProbeWithAMessage(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 1, FailureRate: -1, OpenFor: 10 * time.Second, MaxOpenFor: 35 * time.Second})
	b.fail(1)
	opened := b.clk.Now()
	g := b.gate(b.clk.Now())
	require.NotNil(t, g.changed, "open: the receive loop waits")
	assert.Equal(t, opened.Add(10*time.Second), g.until)

	b.clk.Add(10 * time.Second)
	g = b.gate(b.clk.Now())
	assert.Equal(t, 1, g.limit, "half-open: one message to probe with")
	assert.Equal(t, outage.HalfOpen, b.status().State)
	assert.Equal(t, uint64(1), b.status().Probes)
	assert.Equal(t, admitProbe, b.adm(), "the first delivery probes")
	assert.Equal(t, admitWait, b.adm(), "the others wait for its verdict")
	assert.NotNil(t, b.gate(b.clk.Now()).changed, "no receive while the probe runs")

	// A failure that does not count is no verdict: the next message probes.
	assert.True(t, b.record(b.last, attemptNeutral, errDown))
	assert.Equal(t, outage.HalfOpen, b.status().State)
	assert.Equal(t, admitProbe, b.adm())

	// A counted failure opens it again, for twice as long.
	assert.True(t, b.record(b.last, attemptFailure, errDown))
	st := b.status()
	assert.Equal(t, outage.Open, st.State)
	assert.Equal(t, b.clk.Now().Add(20*time.Second), st.NextProbe)
	assert.Equal(t, uint64(1), st.FailedProbes)
	assert.Contains(t, st.Reason, "the probe failed")

	// Again: doubled, but never beyond MaxOpenFor.
	b.clk.Add(20 * time.Second)
	require.Equal(t, admitProbe, b.adm(), "admit moves it to half-open too")
	b.record(b.last, attemptFailure, errDown)
	assert.Equal(t, b.clk.Now().Add(35*time.Second), b.status().NextProbe)

	b.clk.Add(35 * time.Second)
	require.Equal(t, admitProbe, b.adm())
	assert.False(t, b.record(b.last, attemptSuccess, nil), "a successful probe closes it")
	assert.Equal(t, outage.Closed, b.status().State)
	assert.Equal(t, admitRun, b.adm())
	assert.Equal(t, -1, b.gate(b.clk.Now()).limit)
	assert.Equal(t, []string{
		"closed->open", "open->half-open", "half-open->open", "open->half-open", "half-open->open", "open->half-open", "half-open->closed",
	}, b.transitions())
}

func TestBreakerProbeThatNeverRanIsNoVerdict(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 1, FailureRate: -1, OpenFor: time.Second})
	b.fail(1)
	b.clk.Add(time.Second)
	require.Equal(t, admitProbe, b.adm())
	b.record(b.last, attemptNone, nil) // the delivery stopped before its handler
	assert.Equal(t, admitProbe, b.adm(), "another delivery may probe")
}

func TestBreakerFlappingDoublesThePause(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 1, FailureRate: -1, OpenFor: 10 * time.Second, Window: time.Minute})
	trip := func() time.Duration {
		b.fail(1)
		return b.status().NextProbe.Sub(b.clk.Now())
	}
	closeAfterProbe := func() {
		b.clk.Set(b.status().NextProbe)
		require.Equal(t, admitProbe, b.adm())
		b.record(b.last, attemptSuccess, nil)
	}
	assert.Equal(t, 10*time.Second, trip())
	closeAfterProbe()
	b.clk.Add(5 * time.Second)
	assert.Equal(t, 20*time.Second, trip(), "tripped again within a Window of closing")
	closeAfterProbe()
	b.clk.Add(5 * time.Second)
	assert.Equal(t, 40*time.Second, trip())
	closeAfterProbe()
	b.clk.Add(time.Minute) // a whole Window closed
	assert.Equal(t, 10*time.Second, trip(), "a dependency that stayed up starts from OpenFor again")
}

func TestBreakerHealthCheck(t *testing.T) {
	var calls int
	healthy := false
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 1, FailureRate: -1, OpenFor: time.Second, HealthCheck: func(ctx context.Context) error {
		calls++
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("no deadline")
		}
		if !healthy {
			return errDown
		}
		return nil
	}})
	b.fail(1)
	b.clk.Add(time.Second)
	g := b.gate(b.clk.Now())
	require.True(t, g.check, "half-open with a health check: the loop runs it")
	assert.Equal(t, admitHold, b.adm(), "no message probes")
	assert.NotNil(t, b.gate(b.clk.Now()).changed, "one check at a time")
	b.runHealthCheck(context.Background())
	assert.Equal(t, outage.Open, b.status().State)
	assert.Equal(t, b.clk.Now().Add(2*time.Second), b.status().NextProbe)

	healthy = true
	b.clk.Add(2 * time.Second)
	require.True(t, b.gate(b.clk.Now()).check)
	b.runHealthCheck(context.Background())
	assert.Equal(t, outage.Closed, b.status().State)
	assert.Equal(t, 2, calls)
}

func TestBreakerHealthCheckCutShortByTheRunIsNoVerdict(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 1, FailureRate: -1, OpenFor: time.Second,
		HealthCheck: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }})
	b.fail(1)
	b.clk.Add(time.Second)
	require.True(t, b.gate(b.clk.Now()).check)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.runHealthCheck(ctx)
	assert.Equal(t, outage.HalfOpen, b.status().State)
	assert.True(t, b.gate(b.clk.Now()).check, "the next run checks again")
}

func TestBreakerHealthCheckPanicIsAFailedProbe(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 1, FailureRate: -1, OpenFor: time.Second,
		HealthCheck: func(context.Context) error { panic("boom") }})
	b.fail(1)
	b.clk.Add(time.Second)
	require.True(t, b.gate(b.clk.Now()).check)
	b.runHealthCheck(context.Background())
	assert.Equal(t, outage.Open, b.status().State)
	assert.Contains(t, b.status().Reason, "panicked")
}

func TestBreakerPauseAndResumeByHand(t *testing.T) {
	b := newTestBreaker(t, nil) // outage mode off: only the kill switch
	b.fail(100)
	assert.Equal(t, outage.Closed, b.status().State, "no automatic trips without Options.Outage")
	b.pause("deploying billing; key=secret-value AccountKey=abc")
	st := b.status()
	assert.Equal(t, outage.Open, st.State)
	assert.True(t, st.Manual)
	assert.True(t, st.NextProbe.IsZero(), "no probe while paused by hand")
	assert.NotContains(t, st.Reason, "abc", "redacted")
	b.clk.Add(time.Hour)
	assert.Equal(t, admitHold, b.adm())
	assert.Equal(t, outage.Open, b.status().State, "still paused an hour later")
	assert.True(t, b.record(admission{kind: admitRun}, attemptFailure, errDown), "open: hold")
	assert.Equal(t, b.clk.Now().Add(defaultOutageOpenFor), b.holdUntil(b.clk.Now()))
	b.resume()
	assert.Equal(t, outage.Closed, b.status().State)
	assert.Equal(t, admitRun, b.adm())
	assert.Equal(t, []string{"closed->open", "open->closed"}, b.transitions())
	for _, e := range b.events {
		assert.True(t, e.Manual)
	}
}

func TestBreakerResumeEndsAnAutomaticOpening(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 2, FailureRate: -1})
	b.fail(2)
	require.Equal(t, outage.Open, b.status().State)
	b.resume()
	assert.Equal(t, outage.Closed, b.status().State)
	b.fail(1)
	assert.Equal(t, outage.Closed, b.status().State, "counts start again after a resume")
}

func TestOutageOptionsAreValidated(t *testing.T) {
	cases := []struct {
		name  string
		o     outage.Options
		field string
	}{
		{"both rules off", outage.Options{ConsecutiveFailures: -1, FailureRate: -1}, "Outage.ConsecutiveFailures"},
		{"rate above 1", outage.Options{FailureRate: 1.5}, "Outage.FailureRate"},
		{"negative window", outage.Options{Window: -1}, "Outage.Window"},
		{"negative minimum", outage.Options{MinAttempts: -1}, "Outage.MinAttempts"},
		{"negative pause", outage.Options{OpenFor: -1}, "Outage.OpenFor"},
		{"max below open", outage.Options{OpenFor: time.Minute, MaxOpenFor: time.Second}, "Outage.MaxOpenFor"},
		{"default max below open", outage.Options{OpenFor: time.Hour}, "Outage.MaxOpenFor"},
		{"negative check timeout", outage.Options{HealthCheckTimeout: -1}, "Outage.HealthCheckTimeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := (&Options{Outage: &tc.o}).resolve()
			var oe *OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, tc.field, oe.Field)
		})
	}
}

// adm admits a delivery and returns its kind, keeping the admission for record (b.last).
func (tb *testBreaker) adm() admitKind {
	a, _ := tb.admit()
	if a.kind == admitProbe {
		tb.last = a
	}
	return a.kind
}

func TestBreakerLetsOneLoopAskForTheProbe(t *testing.T) {
	b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 1, FailureRate: -1, OpenFor: time.Second})
	b.fail(1)
	b.clk.Add(time.Second)
	require.Equal(t, 1, b.gate(b.clk.Now()).limit)
	g := b.gate(b.clk.Now())
	require.NotNil(t, g.changed, "a second loop waits while the first one's message is on its way")
	assert.Equal(t, b.clk.Now().Add(probeAskWindow), g.until)
	b.unask() // that receive brought nothing
	assert.Equal(t, 1, b.gate(b.clk.Now()).limit)
	b.clk.Add(probeAskWindow) // or its message never became the probe
	assert.Equal(t, 1, b.gate(b.clk.Now()).limit)
}

// A probe admitted in one half-open period and finishing in a later one decides nothing: a pause, a
// resume and a new trip came in between.
func TestBreakerStaleProbeDecidesNothing(t *testing.T) {
	for _, out := range []attemptOutcome{attemptSuccess, attemptNone} {
		b := newTestBreaker(t, &outage.Options{ConsecutiveFailures: 1, FailureRate: -1, OpenFor: time.Second})
		b.fail(1)
		b.clk.Add(time.Second)
		require.Equal(t, admitProbe, b.adm())
		stale := b.last
		b.pause("")
		b.resume()
		b.fail(1)
		b.clk.Add(2 * time.Second)
		require.Equal(t, admitProbe, b.adm(), "the new period's probe")
		b.record(stale, out, nil)
		assert.Equal(t, outage.HalfOpen, b.status().State, "outcome %d of the old probe", out)
		assert.Equal(t, admitWait, b.adm(), "the new probe still runs alone")
	}
}

// A hook may call Pause or Resume: the change is delivered after the hook returns, in order.
func TestBreakerHookMayPauseAndResume(t *testing.T) {
	var tb *testBreaker
	var seen []string
	tb = newTestBreaker(t, &outage.Options{ConsecutiveFailures: 1, FailureRate: -1})
	tb.hook = func(p outage.Change) {
		seen = append(seen, p.From.String()+"->"+p.To.String())
		if p.To == outage.Open && !p.Manual {
			tb.pause("escalated") // e.g. after too many trips
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tb.fail(1)
		tb.resume()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("deadlock: the hook's Pause never returned")
	}
	assert.Equal(t, []string{"closed->open", "open->open", "open->closed"}, seen)
	assert.Equal(t, admitRun, tb.adm())
}

// A clock before 1970 (a zero time) must not make the rate window panic.
func TestBreakerRateWindowWithAZeroClock(t *testing.T) {
	var w rateWindow
	w.width = 6 * time.Second
	assert.NotPanics(t, func() {
		w.add(time.Time{}, true)
		total, failed := w.sum(time.Time{})
		assert.Equal(t, 1, total)
		assert.Equal(t, 1, failed)
	})
}

// Two holds of one chain at one attempt, from two entities whose sequence numbers overlap (a
// subscription and its retry queue), get different MessageIDs: duplicate detection must not drop the
// second. A redelivery of one held delivery gets the same.
func TestHeldMessageIDsAreDistinctPerDelivery(t *testing.T) {
	env := envelope.Envelope{Attempt: 1, Source: "orders/Subscriptions/billing", FirstSequenceNumber: 42, OriginalMessageID: "m"}
	seq := int64(42)
	first := heldMessageID(env, "orders/Subscriptions/billing", &azservicebus.ReceivedMessage{MessageID: "m", SequenceNumber: &seq})
	again := heldMessageID(env, "orders/Subscriptions/billing", &azservicebus.ReceivedMessage{MessageID: "m", SequenceNumber: &seq})
	fromRetryQueue := heldMessageID(env, "orders-billing-retry", &azservicebus.ReceivedMessage{MessageID: first, SequenceNumber: &seq})
	assert.Equal(t, first, again, "a redelivery computes the same id")
	assert.NotEqual(t, first, fromRetryQueue)
	assert.LessOrEqual(t, len(fromRetryQueue), envelope.MaxMessageIDLength)
	assert.True(t, strings.HasPrefix(first, env.RetryMessageID(1)+"-h"))
}
