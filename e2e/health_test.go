//go:build !live

package e2e

// Truthful health (issue 6, item 5) and fail-fast configuration errors (item 6), through the real SDK
// against the emulator. Every test here needs the emulator's fault hooks or its broker API, so the file
// is not part of the live build.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
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
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// notReadyBound is the promise: with default options, Ready() is false within 15 s of the
// namespace becoming unreachable.
const notReadyBound = 15 * time.Second

// fastClient makes the SDK give up quickly (see fastRetries), so that each reconnect try of the
// consumer is short and the schedule is what the test measures.
var fastClient = &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: fastRetries}}

// runBounded runs c until Run returns by itself or within has passed; then it cancels Run and waits for
// it. returned says whether Run ended on its own, and took how long that took.
func runBounded(t *testing.T, c *retry.Consumer, within time.Duration) (took time.Duration, returned bool, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(ctx) }()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case err = <-done:
		return time.Since(start), true, err
	case <-timer.C:
	}
	cancel()
	select {
	case err = <-done:
	case <-time.After(testTimeout):
		t.Fatal("Run did not return after its context was cancelled")
	}
	return time.Since(start), false, err
}

// okHandler succeeds.
func okHandler(context.Context, *azservicebus.ReceivedMessage) error { return nil }

// startEmulator starts an emulator with cfg and closes it at cleanup; queue names the entity the test
// uses (which need not exist).
func startEmulator(t *testing.T, cfg sbemu.Config, queue string) *env {
	t.Helper()
	em, err := sbemu.Start(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, em.Close()) })
	return &env{connStr: em.ConnectionString(), queue: queue, em: em}
}

// ordersQueue is the suite's queue; dedup turns duplicate detection on (10 minutes).
func ordersQueue(dedup bool, maxDeliveryCount int) broker.QueueConfig {
	q := broker.QueueConfig{Name: "orders", MaxDeliveryCount: maxDeliveryCount}
	if dedup {
		q.DuplicateDetectionWindow = 10 * time.Minute
	}
	return q
}

// brokerQueue is the emulator's queue of e.
func brokerQueue(t *testing.T, e *env) *broker.Queue {
	t.Helper()
	q, ok := e.em.Broker().Queue(e.queue)
	require.True(t, ok, "queue %q", e.queue)
	return q
}

// stateLog records the consumer's state changes with the time they happened.
type stateLog struct {
	mu      sync.Mutex
	changes []stateChange
	changed chan struct{}
}

type stateChange struct {
	at time.Time
	to retry.State
}

func newStateLog() *stateLog { return &stateLog{changed: make(chan struct{}, 1)} }

func (l *stateLog) hook(p retry.StateChangeParams) {
	l.mu.Lock()
	l.changes = append(l.changes, stateChange{at: time.Now(), to: p.To})
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

func (l *stateLog) snapshot() []stateChange {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]stateChange(nil), l.changes...)
}

// since returns the states entered at or after t, in order.
func (l *stateLog) since(t time.Time) []retry.State {
	var out []retry.State
	for _, c := range l.snapshot() {
		if !c.at.Before(t) {
			out = append(out, c.to)
		}
	}
	return out
}

// waitFor waits until the consumer enters s at or after t, and returns when it did.
func (l *stateLog) waitFor(t *testing.T, s retry.State, after time.Time, within time.Duration) time.Time {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		for _, c := range l.snapshot() {
			if c.to == s && !c.at.Before(after) {
				return c.at
			}
		}
		select {
		case <-l.changed:
		case <-deadline.C:
			t.Fatalf("the consumer did not enter %s within %v; states since: %v", s, within, l.since(after))
		}
	}
}

// connectTry is one call of the consumer to its connector, with the connection check that follows.
type connectTry struct {
	start, end time.Time
	ended      bool
	err        error     // the connector's or the check's error
	closed     time.Time // when closing the connection returned (zero while open)
}

// connectLog records every connect try of a consumer: the test's own count of connects, independent of
// the counters the consumer reports.
type connectLog struct {
	mu    sync.Mutex
	tries []connectTry
}

// recordConnects wraps connect so that each call, and the check of the connection it returns, is logged.
func recordConnects(connect retry.Connector) (retry.Connector, *connectLog) {
	l := &connectLog{}
	return func(ctx context.Context) (*retry.Connection, error) {
		i := l.begin()
		conn, err := connect(ctx)
		if err != nil || conn == nil {
			l.end(i, err)
			l.close(i) // nothing to close
			return conn, err
		}
		check := conn.Check
		conn.Check = func(ctx context.Context) error {
			var err error
			if check != nil {
				err = check(ctx)
			}
			l.end(i, err)
			return err
		}
		if closeConn := conn.Close; closeConn != nil {
			conn.Close = func(ctx context.Context) error {
				err := closeConn(ctx)
				l.close(i)
				return err
			}
		}
		return conn, nil
	}, l
}

func (l *connectLog) close(i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tries[i].closed = time.Now()
}

// after is when the consumer was done with a failed try: its connection closed (or, if none was
// built, the connector returned).
func (t connectTry) after() time.Time {
	if !t.closed.IsZero() {
		return t.closed
	}
	return t.end
}

func (l *connectLog) begin() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tries = append(l.tries, connectTry{start: time.Now()})
	return len(l.tries) - 1
}

func (l *connectLog) end(i int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tries[i].end, l.tries[i].ended, l.tries[i].err = time.Now(), true, err
}

func (l *connectLog) snapshot() []connectTry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]connectTry(nil), l.tries...)
}

// ended counts the tries that have ended.
func (l *connectLog) ended() int {
	n := 0
	for _, c := range l.snapshot() {
		if c.ended {
			n++
		}
	}
	return n
}

// tcpCounter is a loopback proxy in front of the emulator that counts the TCP connections clients open,
// including those the SDK opens on its own when it recovers: the broker's view of how hard a client
// hammers it.
type tcpCounter struct {
	ln      net.Listener
	target  string
	accepts atomic.Int64
	wg      sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newTCPCounter(t *testing.T, target string) *tcpCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &tcpCounter{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// connectionString is e's connection string pointed at the proxy.
func (p *tcpCounter) connectionString(e *env) string {
	return strings.Replace(e.connStr, e.em.Addr().String(), p.ln.Addr().String(), 1)
}

func (p *tcpCounter) serve() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepts.Add(1)
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = down.Close()
			continue
		}
		if !p.track(down, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(up, down)
		go p.pipe(down, up)
	}
}

// track registers a proxied pair, unless the proxy is closing (then it closes them).
func (p *tcpCounter) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst; when either side ends, both are closed, as a dropped connection would be.
func (p *tcpCounter) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

func (p *tcpCounter) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

// TestHealthNotReadySoonAfterBrokerDies (item 5a): with default options (the SDK's default retry policy,
// a 30 s settle timeout), a consumer whose broker disappears entirely, or stops answering, reports
// itself not ready within 15 s, with a state and a last error that say why. Before the fix, Ready stayed
// true for the whole outage: the SDK turns a dropped connection into an empty receive, and a receive
// against a hung broker simply blocks.
func TestHealthNotReadySoonAfterBrokerDies(t *testing.T) {
	parallel(t)
	for _, tc := range []struct {
		name   string
		kill   func(t *testing.T, em *sbemu.Emulator)
		revive func(em *sbemu.Emulator) // nil: the broker stays gone
	}{
		{name: "closed", kill: func(t *testing.T, em *sbemu.Emulator) { require.NoError(t, em.Close()) }},
		{name: "hung", kill: func(_ *testing.T, em *sbemu.Emulator) { em.Hang(time.Minute) }, revive: func(em *sbemu.Emulator) { em.Hang(0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parallel(t)
			e := newEnv(t, queueSettings{})
			out := sbtest.NewOutcomes()
			states := newStateLog()
			c := runConsumer(t, newConnector(t, e.connStr, e.queue, nil), okHandler,
				&retry.Options{Hooks: retry.Hooks{OnProcessed: out.Hook, OnStateChange: states.hook}})
			waitRunning(t, c)
			e.send(t, sbtest.Message("before"))
			out.WaitFor(t, "a message before the outage", func(ps []retry.ProcessedParams) bool {
				return count(ps, "before", retry.OutcomeCompleted) == 1
			})
			before := c.Health()

			killed := time.Now()
			tc.kill(t, e.em)
			require.Eventually(t, func() bool { return !c.Health().Ready() }, notReadyBound, 5*time.Millisecond,
				"still ready %v after the broker went away: %+v", notReadyBound, c.Health())
			took := time.Since(killed)
			h := c.Health()
			t.Logf("broker %s: not ready after %v; state %s, last error %q, receive failures %d",
				tc.name, took.Round(time.Millisecond), h.State, h.LastError, h.ReceiveFailures)
			assert.Contains(t, []retry.State{retry.StateReconnecting, retry.StateWatchdog}, h.State, "the state says the connection is being rebuilt")
			assert.Contains(t, strings.ToLower(h.LastError), "connection", "the last error says why")
			assert.False(t, h.LastErrorTime.Before(killed), "the last error is from the outage")
			assert.Greater(t, h.ReceiveFailures, before.ReceiveFailures, "the broken connection is counted")
			assert.NotContains(t, states.since(killed), retry.StateRunning)

			if tc.revive == nil {
				return
			}
			tc.revive(e.em)
			waitRunning(t, c)
			e.send(t, sbtest.Message("after"))
			out.WaitFor(t, "a message after the outage", func(ps []retry.ProcessedParams) bool {
				return count(ps, "after", retry.OutcomeCompleted) == 1
			})
		})
	}
}

// TestRefusedConnectionsFollowTheScheduleAndRecover (items 5b and 5c): while the namespace refuses
// connections, the consumer tries again after each reconnect delay and then once per watchdog interval,
// never sooner (counted by wrapping the connector, and in the consumer's own counters), and it never
// calls itself running meanwhile. When the broker returns, the next watchdog try succeeds: recovery
// within one watchdog interval, and a message sent then is processed.
func TestRefusedConnectionsFollowTheScheduleAndRecover(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	delays := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	const watchdog = 2 * time.Second
	const watchdogTries = 2 // failed watchdog tries observed before the broker returns
	schedule := append(append([]time.Duration(nil), delays...), watchdog, watchdog, watchdog)
	connect, tries := recordConnects(newConnector(t, e.connStr, e.queue, fastClient))
	out := sbtest.NewOutcomes()
	states := newStateLog()
	c := runConsumer(t, connect, okHandler, &retry.Options{
		ReconnectDelays:  delays,
		WatchdogInterval: watchdog,
		SettleTimeout:    5 * time.Second,
		Hooks:            retry.Hooks{OnProcessed: out.Hook, OnStateChange: states.hook},
	})
	waitRunning(t, c)
	require.Len(t, tries.snapshot(), 1)

	outage := time.Now()
	e.em.RefuseConnections(time.Hour)
	e.em.DropConnections()
	failed := len(delays) + watchdogTries
	require.Eventually(t, func() bool {
		ts := tries.snapshot()
		return len(ts) > failed && !ts[failed].closed.IsZero() && c.Health().ConnectFailures >= uint64(failed)
	}, testTimeout, 5*time.Millisecond, "the consumer stopped trying to reconnect")
	during := c.Health()
	ts := tries.snapshot()

	// The broker is back, right after a failed watchdog try: the worst case for recovery.
	e.em.RefuseConnections(0)
	back := time.Now()
	waitRunning(t, c)
	recovered := time.Since(back)

	require.Len(t, ts, 1+failed, "no try beyond the schedule")
	for i, try := range ts[1:] {
		assert.Error(t, try.err, "try %d during the outage", i+1)
	}
	assert.GreaterOrEqual(t, ts[1].start.Sub(outage), delays[0], "the first reconnect waits the first delay")
	var gaps []string
	for j := 2; j < len(ts); j++ {
		gap, want := ts[j].start.Sub(ts[j-1].after()), schedule[j-1]
		gaps = append(gaps, fmt.Sprintf("%v (want %v)", gap.Round(time.Millisecond), want))
		assert.GreaterOrEqual(t, gap, want-5*time.Millisecond, "try %d came too soon", j)
		assert.LessOrEqual(t, gap, want+time.Second, "try %d came too late", j)
	}
	assert.Equal(t, uint64(failed), during.ConnectFailures, "every failed try is counted, and only those")
	assert.Equal(t, uint64(1), during.Connects, "no connect succeeded during the outage")
	assert.Equal(t, retry.StateWatchdog, during.State)
	assert.NotEmpty(t, during.LastError)
	states.waitFor(t, retry.StateRunning, back, testTimeout)
	seen := states.since(outage)
	assert.Equal(t, []retry.State{retry.StateReconnecting, retry.StateWatchdog, retry.StateRunning}, seen,
		"never running during the outage")
	wentWatchdog := states.waitFor(t, retry.StateWatchdog, outage, 0)
	assert.False(t, wentWatchdog.Before(ts[len(delays)].end), "the watchdog takes over only after the last reconnect try failed")

	// One interval plus the time a connect and its check take on a loaded CI machine; well short of two.
	assert.LessOrEqual(t, recovered, watchdog+1500*time.Millisecond, "recovery within one watchdog interval of the broker's return")
	assert.Len(t, tries.snapshot(), 2+failed, "one try brought it back")
	assert.Equal(t, uint64(2), c.Health().Connects)
	t.Logf("outage: %d tries in %v, gaps after each failure %v; connects %d, connect failures %d, receive failures %d; ready %v after the broker returned",
		len(ts)-1, ts[len(ts)-1].end.Sub(outage).Round(time.Millisecond), gaps, during.Connects, during.ConnectFailures,
		during.ReceiveFailures, recovered.Round(time.Millisecond))

	e.send(t, sbtest.Message("after"))
	out.WaitFor(t, "a message after the outage", func(ps []retry.ProcessedParams) bool {
		return count(ps, "after", retry.OutcomeCompleted) == 1
	})
}

// TestFlappingConnectionEscalates (item 5d): a connection that keeps dropping although the broker
// accepts every new one (each probe succeeds, no message ever arrives) must not keep the consumer in
// `running`: two drops on one connection break it, the failures are counted, and the rebuilds follow
// the reconnect schedule up to the watchdog. Before the fix, the SDK's empty receive after each drop
// reset the failure count, so the consumer stayed running forever and never backed off.
func TestFlappingConnectionEscalates(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	proxy := newTCPCounter(t, e.em.Addr().String())
	const watchdog = time.Second
	connect, tries := recordConnects(newConnector(t, proxy.connectionString(e), e.queue, fastClient))
	out := sbtest.NewOutcomes()
	states := newStateLog()
	c := runConsumer(t, connect, okHandler, &retry.Options{
		ReconnectDelays:  []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond},
		WatchdogInterval: watchdog,
		SettleTimeout:    5 * time.Second,
		Hooks:            retry.Hooks{OnProcessed: out.Hook, OnStateChange: states.hook},
	})
	waitRunning(t, c)
	acceptsBefore := proxy.accepts.Load()

	var drops atomic.Int64
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				e.em.DropConnections()
				drops.Add(1)
			}
		}
	}()
	stopFlapping := sync.OnceFunc(func() { close(stop); <-stopped })
	t.Cleanup(stopFlapping)

	flapStart := time.Now()
	wentWatchdog := states.waitFor(t, retry.StateWatchdog, flapStart, 10*time.Second)
	atWatchdog := len(tries.snapshot())
	require.Eventually(t, func() bool { return tries.ended() >= atWatchdog+2 }, testTimeout, 5*time.Millisecond,
		"the watchdog keeps trying")
	stopFlapping()
	ts := tries.snapshot()
	h := c.Health() // after the snapshot: it counts at least the failures that led to those tries
	accepts := proxy.accepts.Load() - acceptsBefore

	// Watchdog tries are at least one interval apart: from the end of one try (and the life of the
	// connection it built) to the start of the next.
	for j := atWatchdog; j < len(ts); j++ {
		gap := ts[j].start.Sub(ts[j-1].end)
		assert.GreaterOrEqual(t, gap, watchdog-5*time.Millisecond, "watchdog try %d came %v after the previous one", j, gap)
	}
	assert.Subset(t, states.since(flapStart), []retry.State{retry.StateReconnecting, retry.StateWatchdog})
	assert.GreaterOrEqual(t, h.ReceiveFailures, uint64(2*(len(ts)-1)), "each drop is counted")
	assert.NotEmpty(t, h.LastError)
	// No tight loop at the TCP level either: each drop costs the consumer's client at most one new
	// connection (the SDK's recovery), plus one per consumer try.
	maxAccepts := drops.Load() + 2*int64(len(ts)) + 4
	assert.LessOrEqual(t, accepts, maxAccepts, "TCP connections during the flapping")
	t.Logf("flapping: %d drops in %v, watchdog after %v; %d consumer tries, %d TCP connections (bound %d); health: connects %d, connect failures %d, receive failures %d",
		drops.Load(), time.Since(flapStart).Round(time.Millisecond), wentWatchdog.Sub(flapStart).Round(time.Millisecond),
		len(ts)-1, accepts, maxAccepts, h.Connects, h.ConnectFailures, h.ReceiveFailures)

	// Once the connection holds again, the consumer is back within a watchdog interval and delivers.
	calm := time.Now()
	require.Eventually(t, func() bool { return c.Health().Ready() }, watchdog+5*time.Second, 5*time.Millisecond)
	t.Logf("ready %v after the flapping stopped", time.Since(calm).Round(time.Millisecond))
	e.send(t, sbtest.Message("after"))
	out.WaitFor(t, "a message after the flapping", func(ps []retry.ProcessedParams) bool {
		return count(ps, "after", retry.OutcomeCompleted) == 1
	})
}

// TestStartupMissingQueue (item 6a): a queue that does not exist is a configuration error: Run returns
// an error wrapping ErrEntityNotFound at once (not after a settle timeout, and not a watchdog loop).
// With RetryStartupErrors the consumer keeps trying instead, not ready, and starts consuming once the
// queue exists.
func TestStartupMissingQueue(t *testing.T) {
	parallel(t)
	t.Run("fails fast", func(t *testing.T) {
		parallel(t)
		e := newEnv(t, queueSettings{})
		c, err := retry.NewConsumer(newConnector(t, e.connStr, "no-such-queue", nil), okHandler, &retry.Options{Logger: quietLogger()})
		require.NoError(t, err)
		took, returned, err := runBounded(t, c, 10*time.Second)
		require.True(t, returned, "Run kept retrying a missing queue: %+v", c.Health())
		t.Logf("Run returned after %v: %v", took.Round(time.Millisecond), err)
		require.ErrorIs(t, err, retry.ErrEntityNotFound)
		assert.Less(t, took, 5*time.Second, "well under the 30 s settle timeout")
		assert.Contains(t, err.Error(), "no-such-queue")
		assert.NotContains(t, err.Error(), sbemu.DefaultKey)
		h := c.Health()
		assert.Equal(t, retry.StateStopped, h.State)
		assert.NotEmpty(t, h.LastError)
	})
	t.Run("RetryStartupErrors waits for the queue", func(t *testing.T) {
		parallel(t)
		// A namespace where the queue has not been created yet.
		em1, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "other"}}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = em1.Close() })
		addr := em1.Addr().String()
		out := sbtest.NewOutcomes()
		c := runConsumer(t, newConnector(t, em1.ConnectionString(), "orders", fastClient), okHandler, &retry.Options{
			RetryStartupErrors: true,
			ReconnectDelays:    []time.Duration{100 * time.Millisecond, 200 * time.Millisecond},
			WatchdogInterval:   500 * time.Millisecond,
			Hooks:              retry.Hooks{OnProcessed: out.Hook},
		})
		require.Eventually(t, func() bool { h := c.Health(); return h.ConnectFailures >= 3 && h.State == retry.StateWatchdog },
			testTimeout, 5*time.Millisecond, "the consumer keeps trying, on to the watchdog: %+v", c.Health())
		h := c.Health()
		assert.False(t, h.Ready())
		assert.Contains(t, h.LastError, "orders")
		assert.Zero(t, h.Connects)

		// The queue is created: the namespace comes back on the same address with it.
		require.NoError(t, em1.Close())
		e := startEmulator(t, sbemu.Config{Addr: addr, Queues: []broker.QueueConfig{ordersQueue(true, 0)}}, "orders")
		waitRunning(t, c)
		e.send(t, sbtest.Message("late"))
		out.WaitFor(t, "a message once the queue exists", func(ps []retry.ProcessedParams) bool {
			return count(ps, "late", retry.OutcomeCompleted) == 1
		})
	})
}

// TestStartupWithoutSendRights (item 6b): a key that may listen but not send passed the old peek check,
// and then every failing message burned its delivery count on schedules refused Unauthorized. The
// connection check now proves the right to send first: Run returns an error wrapping ErrUnauthorized
// before any message is received. The same holds for a key that is wrong altogether.
func TestStartupWithoutSendRights(t *testing.T) {
	parallel(t)
	untouched := func(t *testing.T, e *env) {
		t.Helper()
		q := brokerQueue(t, e)
		st := q.Stats()
		assert.Equal(t, broker.Stats{Active: 1}, st, "the message is still there, unlocked, and nothing was scheduled")
		active := q.ActiveMessages()
		require.Len(t, active, 1)
		assert.Equal(t, "untouched", active[0].Properties.MessageID)
		assert.Zero(t, active[0].Header.DeliveryCount, "never delivered")
	}
	t.Run("listen-only key", func(t *testing.T) {
		parallel(t)
		e := newEnv(t, queueSettings{})
		e.send(t, sbtest.Message("untouched"))
		// Peek works, scheduling is refused: what a key with Listen but not Send rights gets.
		e.em.RejectNextManagement(1, "com.microsoft:schedule-message", 401)
		var called atomic.Int32
		c, err := retry.NewConsumer(newConnector(t, e.connStr, e.queue, nil),
			func(context.Context, *azservicebus.ReceivedMessage) error { called.Add(1); return nil },
			&retry.Options{Logger: quietLogger()})
		require.NoError(t, err)
		took, returned, err := runBounded(t, c, 10*time.Second)
		require.True(t, returned, "Run went on without the right to send: %+v", c.Health())
		t.Logf("Run returned after %v: %v", took.Round(time.Millisecond), err)
		require.ErrorIs(t, err, retry.ErrUnauthorized)
		assert.Less(t, took, 5*time.Second)
		assert.NotContains(t, err.Error(), sbemu.DefaultKey)
		assert.Zero(t, called.Load(), "the handler never ran")
		assert.Zero(t, c.Health().Received)
		untouched(t, e)
	})
	t.Run("wrong key", func(t *testing.T) {
		parallel(t)
		e := startEmulator(t, sbemu.Config{StrictAuth: true, Queues: []broker.QueueConfig{ordersQueue(true, 0)}}, "orders")
		e.send(t, sbtest.Message("untouched"))
		const wrongKey = "bm90LXRoZS1yaWdodC1rZXk="
		bad := strings.Replace(e.connStr, "SharedAccessKey="+sbemu.DefaultKey, "SharedAccessKey="+wrongKey, 1)
		require.NotEqual(t, e.connStr, bad)
		c, err := retry.NewConsumer(newConnector(t, bad, e.queue, nil), okHandler, &retry.Options{Logger: quietLogger()})
		require.NoError(t, err)
		took, returned, err := runBounded(t, c, 10*time.Second)
		require.True(t, returned, "Run kept retrying a refused key: %+v", c.Health())
		t.Logf("Run returned after %v: %v", took.Round(time.Millisecond), err)
		require.ErrorIs(t, err, retry.ErrUnauthorized)
		assert.Less(t, took, 5*time.Second)
		assert.NotContains(t, err.Error(), wrongKey)
		assert.NotContains(t, c.Health().LastError, wrongKey)
		untouched(t, e)
	})
}

// TestConnectionCheckLeavesNoProbe (item 6c): the send-rights check schedules a probe and cancels it, so
// after the consumer has connected (and reconnected) the queue holds nothing: no scheduled, active or
// locked message. A probe whose cancellation was lost is completed when it comes due, without reaching
// the handler.
func TestConnectionCheckLeavesNoProbe(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	var handled atomic.Int32
	out := sbtest.NewOutcomes()
	c := runConsumer(t, newConnector(t, e.connStr, e.queue, fastClient),
		func(context.Context, *azservicebus.ReceivedMessage) error { handled.Add(1); return nil },
		&retry.Options{
			ReconnectDelays:  []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond},
			WatchdogInterval: 500 * time.Millisecond,
			SettleTimeout:    5 * time.Second,
			Hooks:            retry.Hooks{OnProcessed: out.Hook},
		})
	waitRunning(t, c)
	q := brokerQueue(t, e)
	assert.Equal(t, broker.Stats{}, q.Stats(), "nothing left after the first connect")
	assert.Empty(t, q.ScheduledMessages())

	// A reconnect runs the check again (and a failed try must not leave a probe either).
	e.em.RefuseConnections(time.Hour)
	e.em.DropConnections()
	require.Eventually(t, func() bool { return c.Health().ConnectFailures >= 1 }, testTimeout, 5*time.Millisecond)
	e.em.RefuseConnections(0)
	require.Eventually(t, func() bool { h := c.Health(); return h.Connects >= 2 && h.Ready() }, testTimeout, 5*time.Millisecond)
	assert.Equal(t, broker.Stats{}, q.Stats(), "nothing left after a reconnect")
	assert.Empty(t, q.ScheduledMessages())

	// What a probe looks like when it comes due because its cancellation was lost.
	probe := sbtest.Message("sbretry-probe-lost")
	probe.ApplicationProperties = map[string]any{retry.PropProbe: retry.ProbeValue}
	e.send(t, probe)
	require.Eventually(t, func() bool { return c.Health().Received == 1 && e.settled(t) }, testTimeout, 10*time.Millisecond,
		"the lost probe is received and completed")
	assert.Zero(t, handled.Load(), "a probe never reaches the handler")
	assert.Zero(t, brokerQueue(t, e).Stats().DeadLettered)
}

// TestConnectionStringErrors (item 6d): a malformed connection string is an error from the constructor,
// which never repeats the key; a misspelled namespace surfaces its DNS failure at once rather than
// "context deadline exceeded" after the 30 s settle timeout.
func TestConnectionStringErrors(t *testing.T) {
	parallel(t)
	const secret = "c2VjcmV0LWtleS1kby1ub3QtbG9n"
	good := "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=app;SharedAccessKey=" + secret
	for _, tc := range []struct {
		name, connStr, send string
	}{
		{name: "empty", connStr: ""},
		{name: "no endpoint", connStr: "SharedAccessKeyName=app;SharedAccessKey=" + secret},
		{name: "no key", connStr: "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=app"},
		{name: "no key name", connStr: "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey=" + secret},
		{name: "pair without =", connStr: "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=app;SharedAccessKey" + secret},
		{name: "bad emulator flag", connStr: good + ";UseDevelopmentEmulator=maybe"},
		{name: "emulator without sb://", connStr: "Endpoint=amqp://127.0.0.1:5672;SharedAccessKeyName=app;SharedAccessKey=" + secret + ";UseDevelopmentEmulator=true"},
		{name: "malformed send string", connStr: good, send: "SharedAccessKeyName=send;SharedAccessKey=" + secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			connect, err := retry.NewNamespace(tc.connStr, &retry.ConnectOptions{SendConnectionString: tc.send}).Queue("orders")
			require.Error(t, err)
			assert.Nil(t, connect)
			assert.ErrorIs(t, err, retry.ErrInvalidOptions)
			assert.NotContains(t, err.Error(), secret, "the key never appears in the error")
		})
	}

	t.Run("misspelled namespace", func(t *testing.T) {
		parallel(t)
		// .invalid never resolves (RFC 6761).
		const ns = "nonexistent-ns.invalid"
		connStr := "Endpoint=sb://" + ns + "/;SharedAccessKeyName=app;SharedAccessKey=" + secret
		connect := newConnector(t, connStr, "orders", nil)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		start := time.Now()
		conn, err := connect(ctx)
		took := time.Since(start)
		require.Error(t, err)
		assert.Nil(t, conn)
		t.Logf("connector failed after %v: %v", took.Round(time.Millisecond), err)
		var dnsErr *net.DNSError
		assert.ErrorAs(t, err, &dnsErr, "the cause is the name lookup")
		assert.Contains(t, err.Error(), "lookup "+ns)
		assert.NotErrorIs(t, err, context.DeadlineExceeded)
		assert.NotContains(t, err.Error(), secret)
		assert.Less(t, took, 30*time.Second/2, "well before the settle timeout")

		// The consumer shows the same cause in Health after its first try.
		c := runConsumer(t, connect, okHandler, &retry.Options{})
		require.Eventually(t, func() bool { return c.Health().ConnectFailures >= 1 }, 30*time.Second/2, 5*time.Millisecond)
		h := c.Health()
		assert.False(t, h.Ready())
		assert.Contains(t, h.LastError, "lookup "+ns)
		assert.NotContains(t, h.LastError, secret)
	})
}

// TestSeparateSendConnectionString (item 6e): ConnectOptions.SendConnectionString is what the retry
// copies (and the send-rights check) go through. With the same string for both the chain completes; with
// a second namespace as the send target the copy lands there and not in the receiving one; with a key
// the send target refuses, Run fails Unauthorized although the receiving key is good.
func TestSeparateSendConnectionString(t *testing.T) {
	parallel(t)
	failOnce := func(seen chan<- envelope.Envelope) retry.Handler {
		return func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			env, _ := envelope.FromContext(ctx)
			select {
			case seen <- env:
			default:
			}
			if env.Attempt == 1 {
				return errBoom
			}
			return nil
		}
	}
	t.Run("same namespace", func(t *testing.T) {
		parallel(t)
		e := newEnv(t, queueSettings{})
		out := sbtest.NewOutcomes()
		runConsumer(t, newConnector(t, e.connStr, e.queue, &retry.ConnectOptions{SendConnectionString: e.connStr}),
			failOnce(nil), &retry.Options{
				Backoff: backoff.Constant{Interval: 200 * time.Millisecond},
				Hooks:   retry.Hooks{OnProcessed: out.Hook},
			})
		e.send(t, sbtest.Message("split-1"))
		out.WaitFor(t, "the retry completed", func(ps []retry.ProcessedParams) bool {
			return count(ps, "split-1", retry.OutcomeCompleted) == 1
		})
		assert.Equal(t, 1, count(out.Snapshot(), "split-1", retry.OutcomeRetryScheduled))
		require.Eventually(t, func() bool { return e.settled(t) }, testTimeout, 10*time.Millisecond)
	})
	t.Run("copies go to the send namespace", func(t *testing.T) {
		parallel(t)
		e := newEnv(t, queueSettings{})
		target := startEmulator(t, sbemu.Config{Queues: []broker.QueueConfig{ordersQueue(true, 0)}}, "orders")
		out := sbtest.NewOutcomes()
		seen := make(chan envelope.Envelope, 1)
		runConsumer(t, newConnector(t, e.connStr, e.queue, &retry.ConnectOptions{SendConnectionString: target.connStr}),
			failOnce(seen), &retry.Options{
				Backoff: backoff.Constant{Interval: time.Hour},
				Hooks:   retry.Hooks{OnProcessed: out.Hook},
			})
		e.send(t, sbtest.Message("split-2"))
		out.WaitFor(t, "the retry scheduled", func(ps []retry.ProcessedParams) bool {
			return count(ps, "split-2", retry.OutcomeRetryScheduled) == 1
		})
		env := <-seen
		assert.Equal(t, broker.Stats{}, brokerQueue(t, e).Stats(), "the original is completed and no copy is in the receiving namespace")
		scheduled := brokerQueue(t, target).ScheduledMessages()
		require.Len(t, scheduled, 1, "the copy, and no probe, in the send namespace")
		assert.Equal(t, env.RetryMessageID(2), scheduled[0].Message.Properties.MessageID)
	})
	t.Run("send key refused", func(t *testing.T) {
		parallel(t)
		e := startEmulator(t, sbemu.Config{StrictAuth: true, Queues: []broker.QueueConfig{ordersQueue(true, 0)}}, "orders")
		e.send(t, sbtest.Message("untouched"))
		const wrongKey = "c2VuZC1rZXktdGhhdC1pcy13cm9uZw=="
		sendStr := strings.Replace(e.connStr, "SharedAccessKey="+sbemu.DefaultKey, "SharedAccessKey="+wrongKey, 1)
		require.NotEqual(t, e.connStr, sendStr)
		c, err := retry.NewConsumer(newConnector(t, e.connStr, e.queue, &retry.ConnectOptions{SendConnectionString: sendStr}),
			okHandler, &retry.Options{Logger: quietLogger()})
		require.NoError(t, err)
		took, returned, err := runBounded(t, c, 10*time.Second)
		require.True(t, returned, "Run went on with a send key the namespace refuses: %+v", c.Health())
		t.Logf("Run returned after %v: %v", took.Round(time.Millisecond), err)
		require.ErrorIs(t, err, retry.ErrUnauthorized)
		assert.NotContains(t, err.Error(), wrongKey)
		assert.Zero(t, c.Health().Received, "nothing was received")
		assert.Equal(t, broker.Stats{Active: 1}, brokerQueue(t, e).Stats())
	})
}

// From the moment Run's context ends, the consumer reports draining: the readiness probe answers 503
// while a handler still finishes its message within ShutdownGrace, the liveness probe 200; the message
// is completed through the broker and Run returns stopped.
func TestDrainingIsNotReady(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	states := newStateLog()
	started, release := make(chan struct{}), make(chan struct{})
	c, err := retry.NewConsumer(e.connector(), func(context.Context, *azservicebus.ReceivedMessage) error {
		close(started)
		<-release
		return nil
	}, &retry.Options{ShutdownGrace: testTimeout, Logger: quietLogger(), Hooks: retry.Hooks{OnStateChange: states.hook}})
	require.NoError(t, err)
	probe := func(ready bool) int {
		rec := httptest.NewRecorder()
		healthHandlerFor(c, ready).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.send(t, sbtest.Message("slow-1"))
	select {
	case <-started:
	case <-time.After(testTimeout):
		t.Fatal("the handler never started")
	}
	require.Equal(t, http.StatusOK, probe(true))

	stopAt := time.Now()
	cancel()
	states.waitFor(t, retry.StateDraining, stopAt, testTimeout)
	assert.False(t, c.Health().Ready())
	assert.Equal(t, http.StatusServiceUnavailable, probe(true), "readiness while draining")
	assert.Equal(t, http.StatusOK, probe(false), "liveness while draining")

	close(release)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(testTimeout):
		t.Fatal("Run did not return")
	}
	assert.Equal(t, []retry.State{retry.StateDraining, retry.StateStopped}, states.since(stopAt))
	assert.Equal(t, uint64(1), c.Health().Completed)
	assert.True(t, e.settled(t), "the message in flight was completed")
}

// healthHandlerFor is the readiness handler (ready) or the liveness handler.
func healthHandlerFor(c *retry.Consumer, ready bool) http.Handler {
	if ready {
		return retry.ReadinessHandler(c)
	}
	return retry.LivenessHandler(c)
}
