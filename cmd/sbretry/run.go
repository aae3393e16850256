package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/entitypath"
	"github.com/sbretry/retry/internal/redact"
	"github.com/sbretry/retry/sessionstate"
)

// Exit codes, documented in the package documentation: scripts depend on them.
const (
	exitOK       = 0 // done, or found
	exitError    = 1 // an error, a refused confirmation, or an action that stopped part way
	exitUsage    = 2 // the command line cannot run: a bad flag, a missing or ambiguous entity
	exitNotFound = 3 // status, dlq show, cancel: nothing matches what was asked for
	exitPartial  = 4 // status: nothing matches among the messages read, but the read stopped at --max-peek
)

// envConnectionString names the environment variable read when --connection-string is not given.
const envConnectionString = "SERVICEBUS_CONNECTION_STRING"

// Defaults of the flags that take a value.
const (
	defaultTimeout     = 5 * time.Minute
	defaultReceiveWait = 5 * time.Second
	defaultPageLimit   = 50
)

// clientRetries keeps the SDK's own retries short: an operator waiting at a prompt wants an answer, and
// every command is safe to run again.
var clientRetries = azservicebus.RetryOptions{MaxRetries: 3, RetryDelay: 200 * time.Millisecond, MaxRetryDelay: 2 * time.Second}

const usageText = `usage: sbretry [--connection-string S] (--queue Q | --topic T --subscription S (--retry-queue R | --session-consumer)) COMMAND ...

commands:
  status KEY          pending retries, active copies and dead letters of a key, correlation id or message id
                      (--index FILE or postgres:// URL: from the retry-state index, with the history;
                      no broker read)
  pending             pending retries by due time (--limit N, --cursor C, --wide; filters: --contains TEXT,
                      --property NAME=VALUE, --due-after T, --due-before T, --body-contains TEXT; --index PATH:
                      from the retry-state index, in due order over the whole backlog, with the exact total)
  cancel REF...       cancel pending retries (--dry-run; asks for confirmation unless --yes)
  dlq list            dead letters (--reason R, --since T, --until T, --contains TEXT, --property NAME=VALUE,
                      --body-contains TEXT, --wide; --index PATH: from the retry-state index, newest first,
                      --limit N, --cursor C, exact total)
  dlq show REF        one dead letter with its properties and body
  dlq redrive         resubmit dead letters as fresh first deliveries (--seq REF,REF | --reason R | --property N=V | --all;
                      --dry-run; --redrive-to QUEUE)
  dlq purge           delete dead letters (same selection; --dry-run; asks for confirmation unless --yes)
  sessions list       held sessions of a session-enabled queue or subscription: what blocks each, its
                      followers, its wake-up (--max-sessions N, default 1000; implies --session-consumer)
  sessions release --session ID
                      release one held session: its retry runs now, or a session blocked after a
                      dead-letter runs its followers (--dry-run; asks for confirmation unless --yes;
                      --wake-to TOPIC for a subscription: the wake-up goes through its topic's rules)
  index rebuild --index FILE|URL
                      read the entity and its dead-letter queue from their first message into the
                      retry-state index: what a recorder lost is read again, events whose copy is gone
                      are marked so, and the noted losses are cleared (a peek of the whole backlog;
                      not bounded by --timeout unless it is given; --json)
  index tail --index FILE|URL
                      keep the index fed from the broker: read what arrived since the last read, every
                      --interval D (default 10s), until interrupted (or for --timeout, when given); for an
                      index kept without a recorder; a first read that fails ends it with exit 1
  serve               the web console (--listen ADDR, default 127.0.0.1:8080; --token T off loopback, or
                      --tokens-file F with reader and operator tokens; --audit-file F; --entity
                      PATH[=RETRYQUEUE] repeatable; --index PATH|URL for its search and pages
                      (--index-dedicated is deprecated: a shared index is as fast); --max-attempts N;
                      --poll-interval D; --window D; --show-bodies; --filter-bodies; --wake-to TOPIC
                      releases a session subscription's sessions through its topic)
  pause --consumer URL   pause one consumer through its control endpoint (retry.ControlHandler), as a
                      kill switch (--reason TEXT; --token T, default $SBRETRY_CONSUMER_TOKEN; --dry-run)
  resume --consumer URL  end its pause, or an open outage breaker (--token; --dry-run)
  outage --consumer URL  show its outage breaker: state, reason, next probe (--token)

audit (dlq redrive, dlq purge, cancel, sessions release, pause, resume):
  --audit-file F         append the action's records to F, the JSON-lines file serve --audit-file reads
                         for the console's audit page: a started record before anything is done (if it
                         cannot be written, nothing is), then the outcome of each message; dry runs and
                         outage are not recorded
  --operator NAME        who is recorded (default $SBRETRY_OPERATOR, else the OS user name)

a REF names a message by its entity and sequence number, as the listings show them:
  'billing-retry/$DeadLetterQueue:17' (quote the $); a bare 17 is enough where only one entity can hold it.

common flags (before or after the command):
  --connection-string S  default $SERVICEBUS_CONNECTION_STRING
  --queue Q | --topic T --subscription S
  --retry-queue Q        queue holding the consumer's retry copies: required for a subscription,
                         unless --session-consumer
  --session-consumer     the entity is consumed by a retry.SessionConsumer, which holds retries in the
                         session and has no retry queue (a subscription then needs no --retry-queue);
                         dlq commands and sessions list work, pending/status need a plain entity; not serve
  --max-peek N           read at most N messages per entity (default 10000)
  --timeout D            bound on the whole command (default 5m)
  --json                 JSON output for jq (every command, dry runs included)
  --trace-file F         append the command's spans (every broker call) to F as OTLP JSON; not for serve
times (--since, --until) are RFC 3339 ("2026-12-01T10:00:00Z") or a duration back from now ("2h").
exit codes: 0 done or found, 1 error, 2 usage, 3 not found (status, dlq show, cancel, sessions release),
  4 not found in a partial read (status stopped at --max-peek: the rest was not read).
`

// app is one invocation of the command: its streams, environment and test hooks.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time
	hooks          hooks
	// trace is the tracing of a command run with --trace-file, nil otherwise (tracefile.go).
	trace *commandTrace
}

// hooks let tests stop a command at chosen points, the way a crash would.
type hooks struct {
	// afterResubmit runs in a redrive after the n-th fresh delivery was sent and before its dead
	// letter is completed.
	afterResubmit func(n int, seq int64)
	// serving runs once serve listens, with the address it listens on.
	serving func(addr string)
}

// run executes the command line args and returns the exit code. It is main without the process: tests
// call it with their own streams.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv, now: time.Now}
	return a.run(ctx, args)
}

// usageError is a command line the command cannot run; it exits 2 with the usage text.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// run runs the command and, when it was traced (--trace-file), ends its trace with the exit code.
func (a *app) run(ctx context.Context, args []string) int {
	err := a.dispatch(ctx, args)
	code := a.exitCode(err)
	a.endTrace(code, err)
	return code
}

// exitCode reports err on stderr (redacted) and returns the exit code for it.
func (a *app) exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(a.stdout, usageText)
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(a.stderr, "sbretry: %s\n\n%s", redact.String(ue.msg), usageText)
		return exitUsage
	case errors.As(err, new(*stoppedError)):
		// Part of the action was done: an error whatever the cause, never "not found" or "usage".
		fmt.Fprintf(a.stderr, "sbretry: %s\n", redact.String(err.Error()))
		return exitError
	case isRefError(err):
		// A selection the command cannot place: the operator must name the entity. Nothing was done.
		fmt.Fprintf(a.stderr, "sbretry: %s\n", redact.String(err.Error()))
		return exitUsage
	case errors.Is(err, errNothingFound):
		return exitNotFound
	case errors.Is(err, errPartialNotFound):
		return exitPartial
	case errors.Is(err, inspect.ErrNotFound), errors.Is(err, sessionstate.ErrNotHeld):
		fmt.Fprintf(a.stderr, "sbretry: %s\n", redact.String(err.Error()))
		return exitNotFound
	default:
		fmt.Fprintf(a.stderr, "sbretry: %s\n", redact.String(err.Error()))
		return exitError
	}
}

// dispatch finds the command among the leading words of args (flags may come before it) and runs it
// with the remaining arguments.
func (a *app) dispatch(ctx context.Context, args []string) error {
	var words []string
	rest := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		arg := args[i]
		switch {
		case len(words) < 2 && !strings.HasPrefix(arg, "-") && (len(words) == 0 || words[0] == "dlq" || words[0] == "sessions" || words[0] == "index"):
			words = append(words, arg)
		case arg == "-h" || arg == "--help" || arg == "-help":
			return flag.ErrHelp
		default:
			rest = append(rest, arg)
			// A flag's value must not be taken for the command name.
			if strings.HasPrefix(arg, "-") && !strings.Contains(arg, "=") && takesValue(arg) && i+1 < len(args) {
				i++
				rest = append(rest, args[i])
			}
		}
	}
	if len(words) == 0 {
		return usagef("no command")
	}
	name := words[0]
	if name == "dlq" {
		if len(words) < 2 {
			return usagef("dlq needs a subcommand: list, show, redrive or purge")
		}
		name += " " + words[1]
	}
	if name == "sessions" {
		if len(words) < 2 {
			return usagef("sessions needs a subcommand: list or release")
		}
		name += " " + words[1]
	}
	if name == "index" {
		if len(words) < 2 {
			return usagef("index needs a subcommand: rebuild or tail")
		}
		name += " " + words[1]
	}
	switch name {
	case "status":
		return a.status(ctx, rest)
	case "pending":
		return a.pending(ctx, rest)
	case "cancel":
		return a.cancel(ctx, rest)
	case "dlq list":
		return a.dlqList(ctx, rest)
	case "dlq show":
		return a.dlqShow(ctx, rest)
	case "dlq redrive":
		return a.dlqRedrive(ctx, rest)
	case "dlq purge":
		return a.dlqPurge(ctx, rest)
	case "sessions list", "sessions held":
		return a.sessionsList(ctx, rest)
	case "sessions release":
		return a.sessionsRelease(ctx, rest)
	case "serve":
		return a.serve(ctx, rest)
	case "index rebuild", "index tail":
		return a.indexFeed(ctx, name, rest)
	case "pause", "resume", "outage":
		return a.consumerCommand(ctx, name, rest)
	}
	return usagef("unknown command %q", name)
}

// stoppedError is an action (redrive, purge, cancel) that stopped part way: it exits with exitError
// whatever its cause, since part of the action may be done and a re-run finishes it.
type stoppedError struct{ err error }

func (e *stoppedError) Error() string { return e.err.Error() }
func (e *stoppedError) Unwrap() error { return e.err }

// stopped marks err, when there is one, as an action that stopped part way.
func stopped(err error) error {
	if err == nil {
		return nil
	}
	return &stoppedError{err: err}
}

// isRefError reports an error about a message reference or an entity the command line named: an
// ambiguous or malformed REF, an entity the command does not read, a subscription without its retry
// queue.
func isRefError(err error) bool {
	for _, target := range []error{inspect.ErrAmbiguousRef, inspect.ErrInvalidRef, inspect.ErrUnknownEntity, inspect.ErrNoRetryQueue} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// takesValue reports whether a flag (of any command) consumes the next argument.
func takesValue(arg string) bool {
	switch strings.TrimLeft(arg, "-") {
	case "connection-string", "queue", "topic", "subscription", "retry-queue", "max-peek", "timeout",
		"limit", "cursor", "reason", "since", "until", "contains", "seq", "redrive-to", "ttl", "wait",
		"listen", "token", "entity", "poll-interval", "window", "trace-file", "consumer", "session", "max-sessions", "index", "audit-file", "operator":
		return true
	}
	return false
}

// common are the flags every command takes.
type common struct {
	connStr, queue, topic, subscription, retryQueue string
	maxPeek                                         int
	timeout                                         time.Duration
	json                                            bool
	// sessionConsumer is --session-consumer: a retry.SessionConsumer consumes the entity, so a
	// subscription has no retry queue (inspect.Options.SessionConsumer).
	sessionConsumer bool
	// noRetries makes the client retry nothing (sessions release): azservicebus retries a call whose
	// session lock was lost by accepting the session again, which would write a release's state under a
	// new lock, after a consumer may have written a newer one (inspect.Inspector.Release).
	noRetries bool
	// maxSessions is --max-sessions (sessions list only); zero means the inspector's default.
	maxSessions int
	// traceFile is --trace-file: where the command's spans are appended (tracefile.go).
	traceFile string
	// command is the command's name, as newFlagSet was given it ("dlq redrive").
	command string
}

// newFlagSet returns a flag set with the common flags registered into c.
func newFlagSet(name string, c *common) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors come back from Parse and are printed once, redacted
	fs.StringVar(&c.connStr, "connection-string", "", "")
	fs.StringVar(&c.queue, "queue", "", "")
	fs.StringVar(&c.topic, "topic", "", "")
	fs.StringVar(&c.subscription, "subscription", "", "")
	fs.StringVar(&c.retryQueue, "retry-queue", "", "")
	fs.IntVar(&c.maxPeek, "max-peek", inspect.DefaultMaxPeek, "")
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "")
	fs.BoolVar(&c.json, "json", false, "")
	fs.BoolVar(&c.sessionConsumer, "session-consumer", false, "")
	fs.StringVar(&c.traceFile, "trace-file", "", "")
	c.command = name
	return fs
}

// parseArgs parses flags anywhere among args and returns the positional arguments.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef("%s: %v", fs.Name(), err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// entity returns the entity named by the flags; every problem is a usage error.
func (c *common) entity() (inspect.Entity, error) {
	e, err := c.parseEntity()
	var ue *usageError
	if err != nil && !errors.As(err, &ue) {
		return e, usagef("%v", err)
	}
	return e, err
}

func (c *common) parseEntity() (inspect.Entity, error) {
	switch {
	case c.queue != "" && (c.topic != "" || c.subscription != ""):
		return inspect.Entity{}, usagef("give --queue, or --topic with --subscription, not both")
	case strings.Contains(c.queue, "/"):
		return inspect.Entity{}, usagef("--queue %q: name a queue; for a subscription give --topic and --subscription (its dead-letter queue is read with it)", c.queue)
	case c.queue != "":
		return inspect.ParseEntity(c.queue)
	case c.topic != "" && c.subscription != "":
		return inspect.ParseEntity(entitypath.Subscription(c.topic, c.subscription))
	case c.topic != "" || c.subscription != "":
		return inspect.Entity{}, usagef("--topic and --subscription go together")
	}
	return inspect.Entity{}, usagef("no entity: give --queue, or --topic and --subscription")
}

// session is what a command works with: the client and an inspector over the entity.
type session struct {
	entity    inspect.Entity
	client    *azservicebus.Client
	inspector *inspect.Inspector
}

// open validates the common flags, connects and returns the session and a context bounded by
// --timeout; call close when done.
func (a *app) open(ctx context.Context, c *common) (*session, context.Context, func(), error) {
	e, err := c.entity()
	if err != nil {
		return nil, nil, nil, err
	}
	if e.IsSubscription() && c.retryQueue == "" && !c.sessionConsumer {
		// Never answer "nothing" for a place not looked at: the retry library's subscription
		// consumers always have a retry queue, and only the operator knows its name; a session
		// consumer has none, which only the operator can say.
		return nil, nil, nil, usagef("subscription %s: give --retry-queue QUEUE, the queue its consumer schedules retries on: its pending retries and its last attempts' dead letters are there, and an answer without them would leave them out (or --session-consumer, if a retry.SessionConsumer consumes it: it has no retry queue)", e)
	}
	if c.sessionConsumer && c.retryQueue != "" {
		return nil, nil, nil, usagef("--session-consumer and --retry-queue: a session consumer schedules no retry copies, so it has no retry queue; give one or the other")
	}
	if c.maxPeek <= 0 {
		return nil, nil, nil, usagef("--max-peek must be positive")
	}
	if c.timeout <= 0 {
		return nil, nil, nil, usagef("--timeout must be positive")
	}
	connStr := c.connStr
	if connStr == "" {
		connStr = a.getenv(envConnectionString)
	}
	if connStr == "" {
		return nil, nil, nil, usagef("no connection string: give --connection-string or set %s", envConnectionString)
	}
	retries := clientRetries
	if c.noRetries {
		retries = azservicebus.RetryOptions{MaxRetries: -1}
	}
	client, err := azservicebus.NewClientFromConnectionString(connStr, &azservicebus.ClientOptions{RetryOptions: retries})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("connection string: %w", err)
	}
	var obs inspect.Observer
	if c.traceFile != "" {
		tctx, o, err := a.startTracing(ctx, c, connStr)
		if err != nil {
			_ = client.Close(ctx)
			return nil, nil, nil, err
		}
		ctx, obs = tctx, o
	}
	in, err := inspect.New(client, e.Path(), &inspect.Options{MaxPeek: c.maxPeek, MaxSessions: c.maxSessions, RetryQueue: c.retryQueue, SessionConsumer: c.sessionConsumer, Observer: obs})
	if err != nil {
		_ = client.Close(ctx)
		return nil, nil, nil, usagef("%v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	closeAll := func() {
		cancel()
		// Closing is bounded even when the command was interrupted.
		closeCtx, done := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer done()
		_ = client.Close(closeCtx)
	}
	return &session{entity: e, client: client, inspector: in}, cctx, closeAll, nil
}

// warnTruncated tells the operator on stderr when a scan stopped at --max-peek.
func (a *app) warnTruncated(scans ...inspect.Scan) {
	for _, s := range scans {
		if s.Foreign > 0 {
			fmt.Fprintf(a.stderr, "sbretry: warning: %d messages of %s belong to retry chains of another entity (sbretry-source) and were left out: is --retry-queue shared, or the wrong queue?\n", s.Foreign, s.Entity)
		}
		if s.Truncated {
			fmt.Fprintf(a.stderr, "sbretry: warning: read only the first %d messages of %s (--max-peek); the answer covers those only\n", s.Peeked, s.Entity)
		}
	}
}
