// Command soak is the standing soak of issue 10 (see soak/README.md): it runs the emulator in this
// process, a real consumer process (soakconsumer, built from this repository) behind a fault-injecting
// TCP proxy, kills and restarts that process at random times while connections are dropped, reset, cut
// mid-frame and stalled, locks expire and sends are rejected, and then checks by set arithmetic over
// message ids that nothing was lost, forked or needlessly repeated. It stops by itself, prints the seed
// first and one summary line last, and exits 1 if any check failed.
//
//	go run ./soak/cmd/soak              # full: 10,000 messages
//	go run ./soak/cmd/soak -short       # CI: 1,000 messages, under 2 minutes
//	go run ./soak/cmd/soak -seed 42     # replay a seed
//	go run ./soak/cmd/soak -sessions 200 # the sessions soak: a retry.SessionConsumer on 200 sessions
//
// With -sessions N (sessions.go) the queue is session-enabled, the producer sends each of N sessions an
// ordered sequence, the consumer process runs a retry.SessionConsumer, and the checks add the session
// rules: every session's messages end in the order sent, and the repeats are counted.
package main

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/soak/internal/faultproxy"
	"github.com/sbretry/retry/soak/internal/ledger"
	"github.com/sbretry/retry/soak/internal/sessionmode"
)

// settings are the flags; -short changes the defaults of the sizes.
type settings struct {
	seed             uint64
	messages         int
	chaos            time.Duration
	killMin, killMax time.Duration
	restartMax       time.Duration
	drain            time.Duration
	maxStall         time.Duration
	concurrency      int
	maxAttempts      int
	lockDuration     time.Duration
	keepLocks        string
	consumer, out    string
	exclude          string
	keep, race       bool
	reconnectDelays  string
	short            bool
	consumerFlags    string
	// The sessions soak's (sessions.go): sessions is 0 for the queue soak.
	sessions    int
	sessionMode string
	maxSessions int
	sessionIdle time.Duration
	maxHold     time.Duration
}

func parseFlags() settings {
	var s settings
	flag.Uint64Var(&s.seed, "seed", 0, "seed of the run (message classes, fault schedule, kill times); 0 picks one")
	flag.BoolVar(&s.short, "short", false, "the CI size: 1,000 messages over 30 s of chaos")
	flag.IntVar(&s.messages, "messages", 10000, "messages to send (unique ids)")
	flag.DurationVar(&s.chaos, "chaos", 100*time.Second, "how long faults and kills go on")
	flag.DurationVar(&s.killMin, "kill-min", 4*time.Second, "shortest time between kills")
	flag.DurationVar(&s.killMax, "kill-max", 12*time.Second, "longest time between kills")
	flag.DurationVar(&s.restartMax, "restart-max", time.Second, "longest pause before a killed consumer is restarted")
	flag.DurationVar(&s.drain, "drain", 90*time.Second, "how long the queue may take to settle once the chaos ends")
	flag.DurationVar(&s.maxStall, "max-stall", 5*time.Second, "longest allowed window without progress after a fault cleared, while work waits")
	flag.IntVar(&s.concurrency, "concurrency", 16, "the consumer's MaxConcurrency")
	flag.IntVar(&s.maxAttempts, "max-attempts", 4, "the consumer's MaxAttempts")
	flag.DurationVar(&s.lockDuration, "lock-duration", 5*time.Second, "the queue's lock duration")
	flag.StringVar(&s.keepLocks, "keep-locks", "seed", "emulator KeepLocksOnDisconnect: true, false, or seed (drawn from the seed)")
	flag.StringVar(&s.reconnectDelays, "reconnect-delays", "", "the consumer's ReconnectDelays (comma-separated); empty means the library's default")
	flag.StringVar(&s.consumerFlags, "consumer-flags", "", "more flags for soakconsumer, space-separated")
	flag.StringVar(&s.exclude, "exclude", "", "comma-separated fault kinds to leave out (see chaos.log names), and reject-settlements-retryable for the server-busy and internal-error settlement rejections")
	flag.StringVar(&s.consumer, "consumer", "", "a prebuilt soakconsumer binary; empty builds one from this repository")
	flag.BoolVar(&s.race, "race", true, "build the consumer with the race detector (a reported race fails the run)")
	flag.StringVar(&s.out, "out", "", "directory for the ledger, the chaos log and the consumer logs; empty means a temporary one")
	flag.BoolVar(&s.keep, "keep", false, "keep the output directory even when the run passes")
	flag.IntVar(&s.sessions, "sessions", 0, "run the sessions soak over this many sessions (0: the queue soak); -messages then defaults to "+fmt.Sprint(perSession)+" per session ("+fmt.Sprint(perSessionShort)+" with -short)")
	flag.StringVar(&s.sessionMode, "session-mode", "inplace", "with -sessions: how a failure holds its session: inplace (in memory), or durable (SessionOptions.DurableHolds: deferred in the session, recorded in its state)")
	flag.DurationVar(&s.maxHold, "max-hold", 0, "with -sessions: the consumer's MaxHold; 0 means the library's default (5m) in place, 1ns (every delayed retry durable) with -session-mode durable")
	flag.IntVar(&s.maxSessions, "max-sessions", 16, "with -sessions: the consumer's MaxConcurrentSessions")
	flag.DurationVar(&s.sessionIdle, "session-idle", 500*time.Millisecond, "with -sessions: the consumer's SessionIdleTimeout")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if s.sessions > 0 && !set["messages"] {
		s.messages = s.sessions * perSession
		if s.short {
			s.messages = s.sessions * perSessionShort
		}
	}
	if s.short {
		def := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		def("messages", func() {
			if s.sessions == 0 {
				s.messages = 1000
			}
		})
		def("chaos", func() { s.chaos = 30 * time.Second })
		def("kill-min", func() { s.killMin = 3 * time.Second })
		def("kill-max", func() { s.killMax = 7 * time.Second })
		def("drain", func() { s.drain = 45 * time.Second })
	}
	if s.seed == 0 {
		s.seed = uint64(time.Now().UnixNano())%1_000_000_000 + 1
	}
	return s
}

func main() {
	os.Exit(run(parseFlags()))
}

// queueName is the soak's queue.
const queueName = "soak"

// extraSettleSlots mirrors the consumer's: deliveries whose settle is in flight beyond MaxConcurrency.
const extraSettleSlots = 64

func run(s settings) int {
	began := time.Now()
	if s.sessions > 0 {
		if _, err := sessionmode.Parse(s.sessionMode); err != nil {
			return fail(err)
		}
	}
	queue := queueName
	if s.sessions > 0 {
		queue = sessionQueueName
	}
	baseline := goleak.IgnoreCurrent()
	rng := func(stream uint64) *rand.Rand { return rand.New(rand.NewPCG(s.seed, stream)) }
	keepLocks := s.keepLocks == "true" || (s.keepLocks == "seed" && rng(0).IntN(2) == 1)

	out := s.out
	if out == "" {
		var err error
		if out, err = os.MkdirTemp("", "soak-"); err != nil {
			return fail(err)
		}
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		return fail(err)
	}
	fmt.Printf("soak: seed=%d messages=%d%s chaos=%v keep-locks=%v exclude=%q out=%s\n", s.seed, s.messages, sessionsBanner(s), s.chaos, keepLocks, s.exclude, out)
	fmt.Printf("soak: replay with: go run ./soak/cmd/soak -seed %d%s\n", s.seed, replayFlags(s))

	bin := s.consumer
	if bin == "" {
		bin = filepath.Join(out, "soakconsumer")
		args := []string{"build", "-o", bin}
		if s.race {
			args = append(args, "-race")
		}
		args = append(args, "github.com/sbretry/retry/soak/cmd/soakconsumer")
		build := exec.Command(cmp.Or(os.Getenv("GO"), "go"), args...) // GO: the toolchain make uses
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fail(fmt.Errorf("building the consumer: %w", err))
		}
	}

	em, err := sbemu.Start(sbemu.Config{
		KeepLocksOnDisconnect: keepLocks,
		Queues: []broker.QueueConfig{{
			Name:                     queue,
			LockDuration:             s.lockDuration,
			DuplicateDetectionWindow: time.Hour, // longer than the run: every republish of an attempt is absorbed
			RequiresSession:          s.sessions > 0,
		}},
	})
	if err != nil {
		return fail(err)
	}
	q, _ := em.Broker().Queue(queue)
	proxy, err := faultproxy.Start(em.Addr().String())
	if err != nil {
		_ = em.Close()
		return fail(err)
	}
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: 3, RetryDelay: 50 * time.Millisecond, MaxRetryDelay: time.Second},
	})
	if err != nil {
		return fail(err)
	}
	sender, err := client.NewSender(queue, nil)
	if err != nil {
		return fail(err)
	}

	ledgerPath := filepath.Join(out, "ledger.log")
	chaosLog, err := os.Create(filepath.Join(out, "chaos.log"))
	if err != nil {
		return fail(err)
	}
	defer chaosLog.Close()
	consumerArgs := []string{"-queue", queue, "-ledger", ledgerPath,
		"-max-attempts", fmt.Sprint(s.maxAttempts), "-concurrency", fmt.Sprint(s.concurrency)}
	if s.reconnectDelays != "" {
		consumerArgs = append(consumerArgs, "-reconnect-delays", s.reconnectDelays)
	}
	consumerArgs = append(consumerArgs, sessionConsumerArgs(s)...)
	consumerArgs = append(consumerArgs, strings.Fields(s.consumerFlags)...)
	proc := &consumerProcess{
		bin:    bin,
		args:   consumerArgs,
		env:    []string{"SOAK_CONNECTION_STRING=" + strings.Replace(em.ConnectionString(), em.Addr().String(), proxy.Addr(), 1), "GORACE=halt_on_error=0"},
		outDir: out,
	}

	tail := ledger.NewTail(ledgerPath)
	mon := newMonitor(tail, q, began)
	ch := &chaos{em: em, proxy: proxy, mon: mon, log: chaosLog, start: began, counts: map[string]int{}, exclude: map[string]bool{}}
	for _, k := range strings.Split(s.exclude, ",") {
		if k = strings.TrimSpace(k); k != "" {
			ch.exclude[k] = true
		}
	}
	var violations []string
	violate := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }

	if err := proc.start(); err != nil {
		return fail(err)
	}
	stopMon := make(chan struct{})
	monDone := make(chan struct{})
	go func() { mon.run(stopMon); close(monDone) }()

	// Chaos phase: messages go out over most of it, faults and kills over all of it.
	ids, planned := plan(rng(3), s.messages, s.maxAttempts-1)
	if s.sessions > 0 {
		ids, planned = planSessions(rng(3), s.sessions, s.messages, s.maxAttempts-1)
	}
	prod := &producer{sender: sender, planned: planned, sent: map[string]ledger.Expect{}}
	chaosEnd := time.Now().Add(s.chaos)
	prodErr := make(chan error, 1)
	go func() { prodErr <- prod.run(ids, time.Now().Add(s.chaos*85/100), chaosEnd.Add(s.drain)) }()
	chaosDone := make(chan struct{})
	go func() { ch.run(rng(1), chaosEnd); close(chaosDone) }()
	killErr := make(chan error, 1)
	go func() { killErr <- ch.killer(rng(2), proc, s.killMin, s.killMax, s.restartMax, chaosEnd) }()

	if err := <-prodErr; err != nil {
		violate("the producer gave up: %v", err)
	}
	<-chaosDone
	if err := <-killErr; err != nil {
		violate("restarting the consumer failed: %v", err)
	}
	ch.clear()
	ch.note("chaos over; draining")
	if !proc.running() {
		if err := proc.start(); err != nil {
			violate("restarting the consumer failed: %v", err)
		}
	}

	// Drain: wait for the queue to hold nothing but cancelled-probe leftovers, steadily.
	drained := waitDrained(q, s.drain, s.sessions > 0)
	if !drained {
		st := q.Stats()
		violate("the queue did not settle within %v of the chaos ending: %+v", s.drain, st)
	}
	ch.note("drained=%v; stopping the consumer", drained)
	if err := proc.stop(60 * time.Second); err != nil {
		violate("the consumer's shutdown failed: %v", err)
	}
	close(stopMon)
	<-monDone
	for _, e := range proc.unexpectedExits() {
		violate("%s", e)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	dead, err := readDeadLetters(ctx, client, queue)
	cancel()
	if err != nil {
		violate("reading the dead-letter queue: %v", err)
	}
	if n := q.Stats().DeadLettered; n != len(dead) {
		violate("the dead-letter queue holds %d messages but the SDK read %d", n, len(dead))
	}

	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	_ = sender.Close(cctx)
	_ = client.Close(cctx)
	ccancel()
	_ = proxy.Close()
	_ = em.Close()

	longest, longestAt, lastFault, forks, tailErr := mon.result()
	if tailErr != nil {
		violate("reading the ledger: %v", tailErr)
	}
	if len(forks) > 0 {
		violate("two live copies of one attempt: %s", strings.Join(forks, " "))
	}
	if longest > s.maxStall {
		violate("longest window without progress after a fault cleared was %v (ended %v into the run; last fault before it: %s), over %v",
			longest.Round(time.Millisecond), longestAt.Round(time.Millisecond), lastFault, s.maxStall)
	}
	if races := countRaces(out); races > 0 {
		violate("the race detector reported %d data races in consumer logs (grep 'DATA RACE' %s/consumer-*.log)", races, out)
	}

	sent, sendRetries := prod.result()
	counts, drops := ch.summary()
	inFlight := s.concurrency + extraSettleSlots
	if s.sessions > 0 {
		inFlight = s.maxSessions // one handler per session held, the held sessions bounded across connections
	}
	rep := ledger.Check(ledger.Run{
		Sent: sent, Log: tail.Log(), DeadLetters: dead, Kills: counts["kill"],
		MaxAttempts: s.maxAttempts, InFlightBound: inFlight, Sessions: s.sessions > 0,
	})
	violations = append(violations, rep.Violations...)

	// Goroutines back to the baseline, except the SDK's known claim-renewer leak (see TROUBLESHOOTING.md).
	if err := goleak.Find(baseline,
		goleak.IgnoreTopFunction("github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/internal.(*Namespace).startNegotiateClaimRenewer.func3"),
	); err != nil {
		violate("goroutines not back to baseline: %v", err)
	}

	var kinds []string
	for k, v := range counts {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(kinds)
	fmt.Printf("soak: faults %s; failed completes=%d inherited=%d duplicates same-process=%d cross-process=%d; producer retries=%d; consumer starts=%d\n",
		strings.Join(kinds, " "), rep.FailedCompletes, rep.Inherited, rep.SameProcess, rep.CrossProcess, sendRetries, proc.starts)
	if s.sessions > 0 {
		printSessionLine(rep)
	}
	for _, v := range violations {
		fmt.Fprintln(os.Stderr, "soak: FAIL:", v)
	}
	verdict := "PASS"
	if len(violations) > 0 {
		verdict = "FAIL"
	}
	fmt.Printf("soak: sent=%d succeeded=%d dead-lettered=%d (ours %d / broker's %d) lost=%d duplicate-successes=%d kills=%d drops=%d longest-stall=%v wall=%v seed=%d %s\n",
		rep.Sent, rep.Succeeded, rep.DeadOurs+rep.DeadBroker, rep.DeadOurs, rep.DeadBroker, rep.Lost, rep.Duplicates,
		counts["kill"], drops, longest.Round(time.Millisecond), time.Since(began).Round(100*time.Millisecond), s.seed, verdict)
	if len(violations) > 0 {
		fmt.Fprintf(os.Stderr, "soak: evidence kept in %s (ledger.log, chaos.log, consumer-*.log)\n", out)
		return 1
	}
	if s.out == "" && !s.keep {
		_ = os.RemoveAll(out)
	}
	return 0
}

// waitDrained waits up to d for the queue to hold no receivable, locked or scheduled message (other
// than the consumer's send-rights probes, scheduled an hour ahead) for a whole second. On a session
// queue (sessions) a message locked under a session lock is in no Stats count but its session's, and a
// deferred one (a durable hold's) must have been received back too.
func waitDrained(q *broker.Queue, d time.Duration, sessions bool) bool {
	deadline := time.Now().Add(d)
	var quietSince time.Time
	for time.Now().Before(deadline) {
		st := q.Stats()
		empty := st.Active == 0 && st.Locked == 0 && (!sessions || st.Deferred == 0 && sessionsEmpty(q))
		if empty && st.Scheduled > 0 {
			for _, m := range q.ScheduledMessages() {
				var id string
				if m.Message.Properties != nil {
					id, _ = m.Message.Properties.MessageID.(string)
				}
				if !strings.HasPrefix(id, "sbretry-probe-") {
					empty = false
					break
				}
			}
		}
		switch {
		case !empty:
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) >= time.Second:
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// countRaces counts race reports in the consumer logs.
func countRaces(dir string) int {
	files, _ := filepath.Glob(filepath.Join(dir, "consumer-*.log"))
	n := 0
	for _, f := range files {
		b, _ := os.ReadFile(f)
		n += bytes.Count(b, []byte("WARNING: DATA RACE"))
	}
	return n
}

// replayFlags repeats the size flags that differ from the full run's defaults.
func replayFlags(s settings) string {
	var b strings.Builder
	flag.Visit(func(f *flag.Flag) {
		if f.Name != "seed" && f.Name != "out" && f.Name != "keep" {
			fmt.Fprintf(&b, " -%s=%s", f.Name, f.Value)
		}
	})
	return b.String()
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "soak:", err)
	return 2
}
