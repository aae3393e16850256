// Command sbemu runs the in-process Azure Service Bus emulator as a
// standalone server, for local development against the unmodified
// azservicebus SDK.
//
//	sbemu -addr 127.0.0.1:5672 -queue orders -queue payments -lock-duration 30s
//	sbemu -config Config.json
//	sbemu -config Config.json -data ./sbemu-data
//
// -config reads the Config.json of Microsoft's Service Bus emulator
// unchanged (queues, topics, subscriptions, rules); -queue flags add queues
// to it, with the -lock-duration, -max-delivery-count and
// -duplicate-detection-window settings, which apply to -queue queues only.
//
// -strict-auth verifies every token against the namespace's keys: -key-name
// and -key (every right), each -auth-rule NAME=KEY:RIGHTS (repeatable;
// rights Manage, Send, Listen, e.g. -auth-rule listen-only=KEY:Listen) and
// the AuthorizationRules of -config (an sbemu extension of Microsoft's
// format, see sbemu.ConfigFromJSON); a name used twice, an empty key or an
// unknown right is a usage error. -accept-unverified-jwt also accepts
// Entra ID tokens, unverified, with every right.
//
// Once listening it prints the connection string on its own line (starting
// with "Endpoint=sb://"); pass it to azservicebus.NewClientFromConnectionString.
// The administration API (HTTPS) listens on -admin-addr and is logged at
// start; its certificate is signed by a certificate authority of the
// emulator's own, which -admin-cert writes (PEM) for clients to trust. It
// stops cleanly on SIGINT or SIGTERM.
//
// -data DIR keeps entities, messages, scheduled messages, dead letters,
// sequence numbers and duplicate-detection history in DIR, so they survive
// a restart and even a SIGKILL: a send, settlement or management operation
// is acknowledged only once it is on disk. Entities stored there win over
// -config and -queue ones of the same name; new ones are added. Locks do
// not survive: locked messages come back with the delivery counted.
//
// A crash can leave the last journal record unfinished (a torn tail); the
// next start cuts it off and logs it. Damage anywhere else (a bad record
// with intact ones after it, or a damaged snapshot) stops the start with
// an error naming the file and the byte offset, because the records
// after it may have been acknowledged. -truncate-damaged-journal starts
// anyway, cutting the journal at its last good record: what is dropped
// (file, offset, bytes) is logged, and the damaged file is kept next to
// the new one as journal-<gen>.damaged. A damaged snapshot cannot be cut.
//
// If writing or fsyncing the journal fails while serving, the emulator
// answers every client with an error from then on and exits, rather than
// serve a state its disk does not have; the next start begins from what
// was acknowledged.
//
// Exit status: 0 after SIGINT or SIGTERM, 1 when the journal failed while
// serving, 2 on a usage or start-up error (a damaged data directory
// included).
//
// # Files in the -data directory for other processes
//
// Besides its journal, sbemu keeps in DIR what a client in another process
// (a dead-letter monitor, an admin script) needs to reach it:
//
//	admin-ca.pem      the admin API's certificate authority (PEM, public):
//	                  trust it; made by the first start, reused by every
//	                  later one, so trust survives restarts
//	admin-ca-key.pem  its private key (PKCS #8 PEM, mode 0600); delete both
//	                  files to get a new authority
//	endpoints.json    while sbemu runs (removed on a clean stop): the AMQP
//	                  and admin addresses, as {"amqpAddr", "adminAddr",
//	                  "adminEndpoint", "adminCAFile", "adminServerName"}
//
// A Go program builds admin client options from them:
//
//	opts, err := sbemu.AdminClientOptionsFromDir("./sbemu-data")
//	ac, err := admin.NewClientFromConnectionString(connStr, opts)
//
// connStr is the line sbemu printed; the options read endpoints.json and
// admin-ca.pem at every connection, so they keep working when sbemu
// restarts on another admin port. Other clients trust admin-ca.pem
// (NODE_EXTRA_CA_CERTS, REQUESTS_CA_BUNDLE, curl --cacert) and connect to
// adminAddr. Without -data nothing is written (except -admin-cert) and the
// authority is new at every start.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// main exits with status 1 when the journal failed while serving and 2 on
// a usage or start-up error; stop is called explicitly there because
// os.Exit skips deferred calls.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if code := exitCode(err); code != 0 {
		fmt.Fprintln(os.Stderr, err)
		stop()
		os.Exit(code)
	}
}

// exitCode is the documented exit status for run's error: 0 for none (or
// -h, whose usage is already printed), 1 when the journal failed while
// serving, 2 for everything else.
func exitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errJournalStopped):
		return 1
	}
	return 2
}

// errJournalStopped is wrapped by run's error when the emulator stopped
// because its journal could no longer write (see [broker.Broker.JournalFailed]).
var errJournalStopped = errors.New("sbemu: stopped: the journal of the data directory failed")

// testHookStarted, when set by a test, is called with the emulator once it
// listens, before the connection string is printed.
var testHookStarted func(*sbemu.Emulator)

// queueNames collects repeated -queue flags.
type queueNames []string

// String and Set implement [flag.Value], so -queue may be repeated.
func (q *queueNames) String() string { return strings.Join(*q, ",") }

func (q *queueNames) Set(v string) error {
	if v == "" {
		return errors.New("empty queue name")
	}
	*q = append(*q, v)
	return nil
}

// run parses args, starts the emulator, prints its connection string to
// stdout and serves until ctx is done. Logs go to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// ContinueOnError so run returns flag errors (and flag.ErrHelp for
	// -h) to main instead of exiting, which keeps run testable.
	fs := flag.NewFlagSet("sbemu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		queues     queueNames
		addr       = fs.String("addr", "127.0.0.1:5672", "TCP address to listen on")
		lock       = fs.Duration("lock-duration", broker.DefaultLockDuration, "peek-lock duration of every queue")
		maxDeliver = fs.Int("max-delivery-count", broker.DefaultMaxDeliveryCount, "deliveries before a message is dead-lettered")
		dedup      = fs.Duration("duplicate-detection-window", 0, "duplicate detection window on MessageId (0 disables)")
		keyName    = fs.String("key-name", sbemu.DefaultKeyName, "shared access key name in the connection string")
		key        = fs.String("key", sbemu.DefaultKey, "shared access key in the connection string")
		strict     = fs.Bool("strict-auth", false, "verify SAS tokens against -key and refuse others")
		verbose    = fs.Bool("v", false, "log every AMQP frame (debug level)")
		configPath = fs.String("config", "", "Config.json in the format of Microsoft's emulator (queues, topics, subscriptions, rules)")
		keepLocks  = fs.Bool("keep-locks-on-disconnect", false, "keep a dropped connection's locks until they expire instead of returning its messages at once")
		idle       = fs.Duration("idle-timeout", sbemu.DefaultIdleTimeout, "close connections silent for this long (negative disables)")
		adminAddr  = fs.String("admin-addr", "127.0.0.1:0", "TCP address of the HTTPS administration API (port 0: any free port)")
		adminCert  = fs.String("admin-cert", "", "write the administration API's certificate authority (PEM) to this file; with -data it is the same across restarts")
		dataDir    = fs.String("data", "", "keep entities and messages in this directory across restarts and crashes (empty: memory only)")
		jwt        = fs.Bool("accept-unverified-jwt", false, "with -strict-auth: accept Entra ID (jwt) tokens without verifying them, with every right")
		rules      authRules
		truncate   = fs.Bool("truncate-damaged-journal", false, "with -data: start even if the journal is damaged before its end, cutting it at the last good record (later records are lost; logged)")
		limits     sbemu.Limits
	)
	// Every limit of sbemu.Limits; 0 keeps its default, negative removes it.
	fs.IntVar(&limits.MaxConnections, "max-connections", 0, "open connections (0: default 1000, negative: no limit)")
	fs.IntVar(&limits.MaxSessionsPerConnection, "max-sessions-per-connection", 0, "sessions per connection (0: default 256)")
	fs.IntVar(&limits.MaxLinksPerSession, "max-links-per-session", 0, "links per session (0: default 64)")
	fs.IntVar(&limits.MaxOutgoingBytesPerConnection, "max-outgoing-bytes", 0, "bytes queued for one slow client before deliveries wait (0: default 16 MiB)")
	fs.IntVar(&limits.MaxPeekCount, "max-peek-count", 0, "messages one peek may ask for (0: default 1000)")
	fs.IntVar(&limits.MaxPartialMessageBytesPerConnection, "max-partial-message-bytes", 0, "bytes of multi-frame messages being assembled per connection (0: default 64 MiB)")
	fs.Var(&queues, "queue", "queue to create (repeatable; default \"queue\")")
	fs.Var(&rules, "auth-rule", "namespace shared access policy NAME=KEY:RIGHTS, rights Manage, Send, Listen (repeatable; checked with -strict-auth)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sbemu: unexpected arguments %q", fs.Args())
	}
	var cfg sbemu.Config
	if *configPath != "" {
		var err error
		if cfg, err = sbemu.ConfigFromFile(*configPath); err != nil {
			return err
		}
	}
	if len(queues) == 0 && *configPath == "" {
		queues = queueNames{sbemu.DefaultQueueName}
	}
	for _, name := range queues {
		cfg.Queues = append(cfg.Queues, broker.QueueConfig{
			Name:                     name,
			LockDuration:             *lock,
			MaxDeliveryCount:         *maxDeliver,
			DuplicateDetectionWindow: *dedup,
		})
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	cfg.Addr = *addr
	cfg.AdminAddr = *adminAddr
	cfg.KeyName, cfg.Key = *keyName, *key
	cfg.StrictAuth = *strict
	cfg.AuthorizationRules = append(cfg.AuthorizationRules, rules...)
	cfg.AcceptUnverifiedJWT = *jwt
	cfg.KeepLocksOnDisconnect = *keepLocks
	cfg.IdleTimeout = *idle
	cfg.Limits = limits
	cfg.DataDir = *dataDir
	cfg.TruncateDamagedJournal = *truncate
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if !cfg.StrictAuth && (len(cfg.AuthorizationRules) > 0 || cfg.AcceptUnverifiedJWT) {
		// Not an error: a script may switch -strict-auth alone on and off.
		cfg.Logger.Warn("sbemu: authorization rules and -accept-unverified-jwt take effect only with -strict-auth; without it every token has every right")
	}
	em, err := sbemu.Start(cfg)
	if err != nil {
		return err
	}
	if testHookStarted != nil {
		testHookStarted(em)
	}
	if *adminCert != "" {
		if err := os.WriteFile(*adminCert, em.AdminCertificatePEM(), 0o644); err != nil {
			_ = em.Close()
			return fmt.Errorf("sbemu: writing the admin certificate: %w", err)
		}
	}
	// The connection string goes to stdout alone on its line so scripts
	// can capture it; everything else is logged to stderr.
	if _, err := fmt.Fprintln(stdout, em.ConnectionString()); err != nil {
		_ = em.Close()
		return fmt.Errorf("sbemu: writing connection string: %w", err)
	}
	if *dataDir != "" {
		// A start from a data directory reads its files whole and replays them: that garbage, about
		// as large as the files, would stay in the resident set until the runtime's scavenger gets
		// to it. It is returned now, beside serving: at 1,000,000 messages of 1 KiB the resident set
		// falls from 2.9 GiB to 1.4 GiB within seconds of the start (BENCHMARKS.md).
		go debug.FreeOSMemory()
	}
	var stopped error
	select {
	case <-ctx.Done():
	case <-em.Broker().JournalFailed():
		// Every answer is an error from now on (the broker logged why):
		// stop, so that clients and supervisors see it.
		stopped = fmt.Errorf("%w (%s): %w", errJournalStopped, *dataDir, em.Broker().Sync(context.Background()))
	}
	// Close waits for every connection to drain; bound it so a stuck
	// client cannot keep the process alive after a signal. The buffer lets
	// the goroutine finish even if the timeout wins.
	done := make(chan error, 1)
	go func() { done <- em.Close() }()
	select {
	case err := <-done:
		if stopped != nil {
			return stopped // Close reports the same failure
		}
		return err
	case <-time.After(30 * time.Second):
		return errors.Join(stopped, errors.New("sbemu: timed out closing the emulator"))
	}
}
