//go:build !live

package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/cputime"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// The shape of BenchmarkPairedSessions' bursts and of its implementations. Being the test binary's
// flags, they go after the package: go test -bench=BenchmarkPairedSessions ./e2e/ -sessions.count=100.
var (
	sessionsCount  = flag.Int("sessions.count", 200, "measured sessions per burst in BenchmarkPairedSessions")
	sessionsLength = flag.Int("sessions.length", 25, "messages per session in BenchmarkPairedSessions")
	sessionsIdle   = flag.Duration("sessions.idle", 20*time.Millisecond, "SessionIdleTimeout of BenchmarkPairedSessions (both implementations)")
)

const (
	// sessionsConcurrency is how many sessions each implementation holds at once: MaxConcurrentSessions
	// for the consumer, as many accepting goroutines for the loop. 16, as MaxConcurrency in
	// BenchmarkPaired, so that the two benchmarks ask the same of two cores.
	sessionsConcurrency = 16
	// sessionsLongCount and sessionsLongLength are the shape of case=long: 40 sessions of 125 messages,
	// where accepting and releasing a session are a fifth as frequent as in case=success and the
	// per-message path weighs more.
	sessionsLongCount  = 40
	sessionsLongLength = 125
	// sessionsAcceptWindow bounds one accept of the hand-written loop, as the consumer's acceptWindow.
	sessionsAcceptWindow = 10 * time.Second
	// sessionsReleaseTimeout bounds the wait, after a burst, for its sessions to be released.
	sessionsReleaseTimeout = 30 * time.Second
	// sessionsQuiet is the pause after a burst's sessions were released, in which the implementation's
	// workers send their next accepts (a new link each) and park in them, so that this work is not
	// done while the next implementation's burst is measured.
	sessionsQuiet = 20 * time.Millisecond
)

// sessionAccepts counts, per implementation name, the sessions accepted since its start, so that
// BenchmarkPairedSessions can report how many accepts a burst took (a session released while it still
// had messages is accepted again).
var sessionAccepts sync.Map // name -> *atomic.Int64

// countAccept counts one session accepted by the implementation p.
func countAccept(p *pairedImpl) {
	n, _ := sessionAccepts.LoadOrStore(p.name, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

// acceptsOf is how many sessions the implementation p accepted since its start.
func acceptsOf(p *pairedImpl) int64 {
	if n, ok := sessionAccepts.Load(p.name); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// sessionsReceiveOptions are the consumer's receive options (receiveloop.go's receiveOptions): with
// one message asked for, TimeAfterFirstMessage never runs, but the call is the same.
var sessionsReceiveOptions = azservicebus.ReceiveMessagesOptions{TimeAfterFirstMessage: time.Millisecond}

// BenchmarkPairedSessions measures the session consumer's throughput and CPU per message against a
// hand-written session loop, by BenchmarkPaired's method (bench_paired_test.go): both implementations
// run for the whole benchmark, each on an emulator and a client of its own with a session-enabled
// queue, and one round (b.N is the number of rounds) releases one burst into each in turn, adjacent in
// time and in rotating order; the figures are medians of the per-round ratios.
//
// A burst is -sessions.count sessions (200) of -sessions.length messages (25), 5,000 messages,
// scheduled session after session straight into the broker for one instant and released at once; the
// broker's accept takes the free session with the oldest message, so the sessions are taken in that
// order. It holds a cushion of 2 × 16 sessions more, accepted last and not measured, so that until the
// last measured settle every worker still finds a session to accept, as in a busy entity: the figure
// is the steady rate of many short sessions, not the tail of a drained queue. Session ids are new in
// every burst, and a burst ends only once the broker holds none of its sessions locked, plus
// sessionsQuiet, so that every burst starts with every worker parked in an accept.
//
// case=success is that shape; case=long is 40 sessions of 125 messages (5,000 as well, with a cushion
// of 32 sessions of 125), so that a fifth as many sessions are accepted, waited out and released per
// message and the per-message path (receive, handler, complete) weighs more. In both every handler
// succeeds at once.
//
//   - retry: retry.SessionConsumer with MaxConcurrentSessions 16 and SessionIdleTimeout -sessions.idle
//     (20 ms), otherwise the defaults, its logger discarded, counting through OnProcessed;
//   - retry-default: the same with the default SessionIdleTimeout (10 s);
//   - loop (runSessionLoop): 16 goroutines on one client (as the consumer's one connection), each
//     accepting the next session (bounded by 10 s, as the consumer), renewing its lock from a goroutine
//     of its own at half the granted duration, and receiving one message at a time with the
//     consumer's receive options and a receive bounded by the same idle timeout, then the handler, then
//     the complete; a receive that ends with nothing releases the session (closes the receiver);
//   - loop-bounded: the same loop with every complete bounded by the default SettleTimeout under the
//     session lock's context, as the consumer bounds it (settleContext): what a loop that must not hang
//     on a settle pays for it.
//
// Neither renews during a burst: the emulator grants 60 s and a session lasts well under a second.
// Both pay for what renewal costs when it does not fire (a goroutine and a timer per session), which
// is the case of every session shorter than half its lock.
//
// The idle timeout decides how long a drained session keeps its worker; both wait it, once per
// session. 20 ms is well above a receive's round trip on loopback (0.1–1 ms, a few ms on a busy
// machine), so a session is seldom released while it still has messages, and short enough that the
// idle tail is not most of a session's time (25 messages take about 40 ms at 16 sessions at once and
// 10,000 messages a second).
//
//	go test -run='^$' -bench='^BenchmarkPairedSessions$' -benchtime=40x -timeout=30m ./e2e/
//
// With -v it logs one line per round, which e2e/poolsessions.py pools over several runs.
func BenchmarkPairedSessions(b *testing.B) {
	cases := []struct {
		name          string
		count, length int
	}{
		{"case=success", *sessionsCount, *sessionsLength},
		{"case=long", sessionsLongCount, sessionsLongLength},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			idle := *sessionsIdle
			if c.count < 1 || c.length < 1 || idle <= 0 {
				b.Fatalf("%d sessions of %d messages, idle timeout %v: need at least one session of one message and an idle timeout", c.count, c.length, idle)
			}
			succeed := func(context.Context, *azservicebus.ReceivedMessage) error { return nil }
			impls := []*pairedImpl{
				startSessionImpl(b, "loop", func(ctx context.Context, e *env, p *pairedImpl) error {
					return runSessionLoop(ctx, e, sessionLoopConfig{concurrency: sessionsConcurrency, idle: idle}, succeed, p)
				}),
				startSessionImpl(b, "loop-bounded", func(ctx context.Context, e *env, p *pairedImpl) error {
					cfg := sessionLoopConfig{concurrency: sessionsConcurrency, idle: idle, settleTimeout: 30 * time.Second}
					return runSessionLoop(ctx, e, cfg, succeed, p)
				}),
				startSessionImpl(b, "retry", runPairedSessionConsumer(&retry.Options{}, sessionsConcurrency, idle, succeed)),
				// The default SessionIdleTimeout (10 s): a drained session is released at once while
				// every worker is busy, not after its idle timeout (issue 31).
				startSessionImpl(b, "retry-default", runPairedSessionConsumer(&retry.Options{}, sessionsConcurrency, 0, succeed)),
			}
			runPairedSessionBursts(b, impls, c.count, c.length, 2*sessionsConcurrency,
				[]pairedRatio{{"retry", "loop"}, {"retry", "loop-bounded"}, {"retry-default", "loop"}})
		})
	}
}

// startSessionEmulator starts an emulator with the session-enabled queue "orders" at its defaults
// (locks of 60 s).
func startSessionEmulator() (*sbemu.Emulator, error) {
	return sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "orders", RequiresSession: true}}})
}

// startSessionImpl is startPairedImpl (bench_paired_test.go) on a session-enabled queue.
func startSessionImpl(b *testing.B, name string, run func(ctx context.Context, e *env, p *pairedImpl) error) *pairedImpl {
	b.Helper()
	return startPairedImplOn(b, name, startSessionEmulator, run)
}

// runPairedSessionConsumer returns the run function of a retry.SessionConsumer with opts (its logger
// discarded), handler, MaxConcurrentSessions concurrency and SessionIdleTimeout idle, counting an
// original as settled when the consumer reports it completed, as runPairedConsumer does.
func runPairedSessionConsumer(opts *retry.Options, concurrency int, idle time.Duration, handler retry.Handler) func(context.Context, *env, *pairedImpl) error {
	return func(ctx context.Context, e *env, p *pairedImpl) error {
		opts.Logger = slog.New(slog.DiscardHandler)
		onProcessed := opts.Hooks.OnProcessed
		opts.Hooks.OnProcessed = func(pp retry.ProcessedParams) {
			if onProcessed != nil {
				onProcessed(pp)
			}
			if pp.Result.Outcome == retry.OutcomeCompleted {
				p.settled()
				return
			}
			p.failed(fmt.Errorf("%s: outcome %v (settle error %v)", pp.Message.MessageID, pp.Result.Outcome, pp.Result.SettleErr))
		}
		dial, err := retry.NewNamespace(e.connStr, nil).SessionQueue(e.queue)
		if err != nil {
			return err
		}
		// The connector's accepts are counted (countAccept), at the cost of one closure call each.
		connect := func(ctx context.Context) (*retry.SessionConnection, error) {
			conn, err := dial(ctx)
			if err != nil || conn == nil || conn.AcceptNext == nil {
				return conn, err
			}
			accept := conn.AcceptNext
			conn.AcceptNext = func(ctx context.Context) (retry.SessionReceiver, error) {
				r, err := accept(ctx)
				if err == nil {
					countAccept(p)
				}
				return r, err
			}
			return conn, nil
		}
		sc, err := retry.NewSessionConsumer(connect, handler, opts, &retry.SessionOptions{MaxConcurrentSessions: concurrency, SessionIdleTimeout: idle})
		if err != nil {
			return err
		}
		return sc.Run(ctx)
	}
}

// sessionLoopConfig is how the hand-written session loop runs.
type sessionLoopConfig struct {
	// concurrency is how many sessions it holds at once, one goroutine each.
	concurrency int
	// idle is how long a session may go without a message before it is released.
	idle time.Duration
	// hold, if positive, is how long a failed handler holds its session before it is called again
	// (the loop's retry in place); with zero a failure leaves the message unsettled and releases the
	// session.
	hold time.Duration
	// settleTimeout, if positive, bounds every complete, under the session lock's context, as the
	// consumer's settleContext does; with zero a complete is bounded by nothing but the loop's end.
	settleTimeout time.Duration
}

// runSessionLoop is the hand-written session loop: cfg.concurrency goroutines on one client, each
// accepting the next session and serving it (serveSession) until ctx ends. An accept that finds no
// session in its window is asked again (not sooner than a second after the last ask, as the consumer);
// any other accept failure ends the loop with it.
func runSessionLoop(ctx context.Context, e *env, cfg sessionLoopConfig, handle func(context.Context, *azservicebus.ReceivedMessage) error, p *pairedImpl) error {
	client, err := azservicebus.NewClientFromConnectionString(e.connStr, nil)
	if err != nil {
		return err
	}
	defer closeBounded(client.Close)
	var wg sync.WaitGroup
	errs := make(chan error, cfg.concurrency)
	for range cfg.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				started := time.Now()
				actx, cancel := context.WithTimeout(ctx, sessionsAcceptWindow)
				r, err := client.AcceptNextSessionForQueue(actx, e.queue, nil)
				cancel()
				if err != nil {
					var sbErr *azservicebus.Error
					if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &sbErr) && sbErr.Code == azservicebus.CodeTimeout) {
						errs <- err
						return
					}
					// No session now: ask again, but not sooner than the consumer's acceptFloor (1 s)
					// after the last ask, so that an accept answered at once does not spin.
					t := time.NewTimer(time.Second - time.Since(started))
					select {
					case <-t.C:
					case <-ctx.Done():
						t.Stop()
					}
					continue
				}
				countAccept(p)
				serveSession(ctx, r, cfg, handle, p)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// serveSession holds r's session: it renews the session lock from a goroutine of its own and handles
// the session's messages one at a time (receive one, handle, complete) until a receive brings nothing
// within idle, then stops renewing and closes the receiver, which releases the session. A failed
// complete, or a failed handler with no hold, releases the session at once, leaving the message to
// come back first.
func serveSession(ctx context.Context, r *azservicebus.SessionReceiver, cfg sessionLoopConfig, handle func(context.Context, *azservicebus.ReceivedMessage) error, p *pairedImpl) {
	defer closeBounded(r.Close)
	lockCtx, stopRenewing := context.WithCancel(ctx)
	renewing := make(chan struct{})
	go func() {
		defer close(renewing)
		renewSessionLock(lockCtx, r, time.Until(r.LockedUntil()))
	}()
	defer func() {
		stopRenewing()
		<-renewing
	}()
	for {
		rctx, cancel := context.WithTimeout(ctx, cfg.idle)
		msgs, _ := r.ReceiveMessages(rctx, 1, &sessionsReceiveOptions)
		cancel()
		if len(msgs) == 0 {
			return // idle (or the receive failed): release the session
		}
		for _, m := range msgs {
			if !handleInPlace(ctx, lockCtx, m, handle, cfg.hold, p) {
				return
			}
			if err := completeSessionMessage(ctx, lockCtx, r, m, cfg.settleTimeout); err != nil {
				p.failed(err)
				return
			}
			p.settled()
		}
	}
}

// completeSessionMessage completes m, bounded by settleTimeout under lockCtx if settleTimeout is
// positive, else under ctx alone.
func completeSessionMessage(ctx, lockCtx context.Context, r *azservicebus.SessionReceiver, m *azservicebus.ReceivedMessage, settleTimeout time.Duration) error {
	if settleTimeout <= 0 {
		return r.CompleteMessage(ctx, m, nil)
	}
	sctx, cancel := context.WithTimeout(lockCtx, settleTimeout)
	defer cancel()
	return r.CompleteMessage(sctx, m, nil)
}

// handleInPlace calls handle on m until it succeeds (true), waiting hold after each failure; with no
// hold, or when the session lock's context ends during a hold, it gives up (false).
func handleInPlace(ctx, lockCtx context.Context, m *azservicebus.ReceivedMessage, handle func(context.Context, *azservicebus.ReceivedMessage) error, hold time.Duration, p *pairedImpl) bool {
	for {
		err := handle(ctx, m)
		if err == nil {
			return true
		}
		if hold <= 0 {
			p.failed(err)
			return false
		}
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-lockCtx.Done():
			t.Stop()
			return false
		}
	}
}

// renewSessionLock renews r's session lock every half of granted (the lock duration the broker gave at
// accept, on the local clock, as the consumer does) until ctx ends; a failed renewal is tried again at
// the next interval. It never fires within BenchmarkPairedSessions' bursts (see there).
func renewSessionLock(ctx context.Context, r *azservicebus.SessionReceiver, granted time.Duration) {
	interval := max(granted/2, 100*time.Millisecond)
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		rctx, cancel := context.WithTimeout(ctx, interval)
		_ = r.RenewSessionLock(rctx, nil)
		cancel()
		t.Reset(interval)
	}
}

// sessionBurstScheduler releases session bursts: burstScheduler's lead and preparation bookkeeping,
// with every message given the session id of its place in the burst.
type sessionBurstScheduler struct {
	burstScheduler
	// length is how many messages each session of a burst holds.
	length int
}

// init builds the template, sized with the longest message and session ids.
func (s *sessionBurstScheduler) init(b *testing.B) {
	b.Helper()
	sid := "s-" + strconv.Itoa(math.MaxInt32)
	s.tmpl = &amqp.Message{Data: [][]byte{make([]byte, 256)}, Properties: &amqp.MessageProperties{MessageID: "bench-" + strconv.Itoa(math.MaxInt32), GroupID: &sid}}
	encoded, err := s.tmpl.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	s.size = len(encoded)
}

// runPairedSessionBursts is runPaired (bench_paired_test.go) for session bursts: one unmeasured burst
// per implementation, then b.N rounds in rotating order, each burst count sessions of length messages
// measured and cushion sessions more, and the report of BenchmarkPaired.
func runPairedSessionBursts(b *testing.B, impls []*pairedImpl, count, length, cushion int, ratios []pairedRatio) {
	b.Helper()
	s := &sessionBurstScheduler{burstScheduler: burstScheduler{lead: pairedFirstLead}, length: length}
	s.init(b)
	k, extra := count*length, cushion*length
	for _, p := range impls {
		s.run(b, p, k, extra)
	}
	acceptsBefore := make(map[string]int64, len(impls))
	for _, p := range impls {
		acceptsBefore[p.name] = acceptsOf(p)
	}
	results := make(map[string][]burstResult, len(impls))
	b.ResetTimer()
	for round := range b.N {
		for i := range impls {
			p := impls[(round+i)%len(impls)]
			results[p.name] = append(results[p.name], s.run(b, p, k, extra))
		}
		if testing.Verbose() {
			b.Logf("round %2d: %s", round+1, roundLine(impls, results, ratios, round))
		}
	}
	b.StopTimer()
	reportPaired(b, impls, results, ratios)
	// The sessions of a burst are count+cushion; more accepts mean sessions released early.
	for _, p := range impls {
		b.ReportMetric(float64(acceptsOf(p)-acceptsBefore[p.name])/float64(b.N), p.name+"-accepts/burst")
	}
}

// run is burstScheduler.run with sessionBurstScheduler.once: a void burst is redone with a longer lead,
// up to pairedTries times.
func (s *sessionBurstScheduler) run(b *testing.B, p *pairedImpl, k, cushion int) burstResult {
	b.Helper()
	for try := 1; ; try++ {
		res, ok := s.once(b, p, k, cushion)
		if ok {
			return res
		}
		if try == pairedTries {
			b.Fatalf("%s: %d bursts in a row void (the last %s)", p.name, try, res.voidReason())
		}
		b.Logf("%s: void burst (%s); redoing it", p.name, res.voidReason())
	}
}

// once is burstScheduler.once for sessions: it schedules k+cushion messages, s.length to a session,
// session after session, under session ids never used before on p's queue, for one instant T; reads
// the CPU shortly before T, releases them at T, and times the k-th settle from the release. After the
// last settle it waits until the broker holds none of the burst's sessions locked (every worker has
// waited out its idle timeout and closed its receiver), and sessionsQuiet more.
func (s *sessionBurstScheduler) once(b *testing.B, p *pairedImpl, k, cushion int) (burstResult, bool) {
	b.Helper()
	n := k + cushion
	bu := newBurst(k, n)
	p.current.Store(bu)
	defer p.current.Store(nil)

	start := time.Now()
	res := burstResult{lead: s.lead}
	at := start.Add(s.lead)
	var last int64
	for range n {
		if p.scheduled%s.length == 0 {
			sid := "s-" + strconv.Itoa(p.scheduled/s.length)
			s.tmpl.Properties.GroupID = &sid // the broker copies the message, its group id too
		}
		s.tmpl.Properties.MessageID = "bench-" + strconv.Itoa(p.scheduled)
		p.scheduled++
		seq, err := p.queue.Schedule(s.tmpl, s.size, at)
		if err != nil {
			b.Fatalf("%s: scheduling a burst: %v", p.name, err)
		}
		last = seq
	}
	runtime.GC()
	res.prepare = time.Since(start)
	s.prepares = append(s.prepares, res.prepare)
	if len(s.prepares) > pairedLeadWindow {
		s.prepares = s.prepares[1:]
	}
	s.lead = max(pairedMinLead, 2*slices.Max(s.prepares)+pairedCPUAhead)

	onTime := time.Until(at) >= pairedCPUAhead
	if onTime {
		time.Sleep(time.Until(at) - pairedCPUAhead)
	}
	cpu := cputime.Process()
	res.cpuRead = time.Since(at)
	onTime = onTime && res.cpuRead < 0
	time.Sleep(time.Until(at))
	st := p.queue.Stats()
	released := time.Now()
	res.release = released.Sub(at)
	res.exact = st.Active == n && st.Locked == 0
	if err := p.queue.CancelScheduled(last); !errors.Is(err, broker.ErrNotFound) {
		b.Fatalf("%s: the burst was still scheduled after its enqueue time (cancel: %v)", p.name, err)
	}

	timeout := time.NewTimer(pairedBurstTimeout)
	defer timeout.Stop()
	for _, done := range []chan struct{}{bu.measuredDone, bu.allDone} {
		select {
		case <-done:
		case <-p.exited:
			b.Fatalf("%s stopped during a burst: %v", p.name, p.err)
		case <-timeout.C:
			b.Fatalf("%s: %d of %d settled after %v; %s; queue %+v", p.name, bu.settles.Load(), n, pairedBurstTimeout, p.failure(), p.queue.Stats())
		}
	}
	if st := p.queue.Stats(); st.Active != 0 || st.Locked != 0 || st.Scheduled != 0 {
		b.Fatalf("%s: after the burst the queue still holds %+v", p.name, st)
	}
	waitSessionsReleased(b, p)
	time.Sleep(sessionsQuiet)
	if !onTime {
		s.lead = max(s.lead, 2*res.lead)
		return res, false
	}
	res.msgsPerSec = float64(k) / bu.end.Sub(released).Seconds()
	if bu.endCPU > 0 {
		res.cpuPerMsg = float64(bu.endCPU-cpu) / float64(k)
	}
	return res, true
}

// waitSessionsReleased waits, bounded by sessionsReleaseTimeout, until no session of p's queue is
// locked by a receiver.
func waitSessionsReleased(b *testing.B, p *pairedImpl) {
	b.Helper()
	deadline := time.Now().Add(sessionsReleaseTimeout)
	for {
		held := 0
		now := time.Now()
		for _, ss := range p.queue.SessionSnapshots() {
			if ss.LockedUntil.After(now) {
				held++
			}
		}
		if held == 0 {
			return
		}
		if now.After(deadline) {
			b.Fatalf("%s: %d sessions still held %v after the burst", p.name, held, sessionsReleaseTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}
