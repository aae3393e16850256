package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/console"
	"github.com/sbretry/retry/inspect"
)

// Defaults of sbretry serve.
const (
	defaultListen = "127.0.0.1:8080"
	// envConsoleToken names the environment variable read when --token is not given.
	envConsoleToken = "SBRETRY_CONSOLE_TOKEN"
	// shutdownTimeout bounds the wait for requests in flight when serve is interrupted.
	shutdownTimeout = 10 * time.Second
)

// entityList is the repeatable --entity flag: PATH, or PATH=RETRYQUEUE.
type entityList []console.Entity

func (l *entityList) String() string { return fmt.Sprint(*l) }

func (l *entityList) Set(s string) error {
	path, rq, _ := strings.Cut(s, "=")
	*l = append(*l, console.Entity{Path: strings.TrimSpace(path), RetryQueue: strings.TrimSpace(rq)})
	return nil
}

// checkListen refuses an address the console must not be served on without a token: anything but a
// loopback address (an empty host listens on every interface). tokens says a token is required.
func checkListen(addr string, tokens bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--listen %q: %v", addr, err)
	}
	if console.IsLoopbackHost(host) || tokens {
		return nil
	}
	return usagef("--listen %s is not a loopback address: give --token (or set %s) or --tokens-file, which every request must then present", addr, envConsoleToken)
}

// readTokensFile reads the console's tokens from the file at path: one token a line, "NAME ROLE
// SECRET" separated by blanks, ROLE reader or operator; blank lines and lines starting with # are
// skipped. A file keeps the secrets out of the command line, which other users of the machine can
// read. Errors name the line, never its secret.
func readTokensFile(path string) ([]console.Token, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--tokens-file: %v", err)
	}
	var out []console.Token
	for i, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, usagef("--tokens-file %s line %d: want NAME ROLE SECRET (ROLE reader or operator), got %d fields", path, i+1, len(f))
		}
		t := console.Token{Name: f[0], Secret: f[2]}
		switch f[1] {
		case "reader":
			t.Role = console.RoleReader
		case "operator":
			t.Role = console.RoleOperator
		default:
			return nil, usagef("--tokens-file %s line %d: role %q is neither reader nor operator", path, i+1, f[1])
		}
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, usagef("--tokens-file %s holds no token", path)
	}
	return out, nil
}

// serve runs the web console (package console) for the entities given, on --listen, until the
// command is interrupted.
func (a *app) serve(ctx context.Context, args []string) error {
	var c common
	var entities entityList
	fs := newFlagSet("serve", &c)
	listen := fs.String("listen", defaultListen, "")
	token := fs.String("token", "", "")
	tokensFile := fs.String("tokens-file", "", "")
	auditFile := fs.String("audit-file", "", "")
	fs.Var(&entities, "entity", "")
	poll := fs.Duration("poll-interval", console.DefaultPollInterval, "")
	window := fs.Duration("window", console.DefaultWindow, "")
	bodies := fs.Bool("show-bodies", false, "")
	filterBodies := fs.Bool("filter-bodies", false, "")
	index := fs.String("index", "", "")
	indexDedicated := fs.Bool("index-dedicated", false, "")
	maxAttempts := fs.Int("max-attempts", 0, "")
	wakeTo := fs.String("wake-to", "", "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("serve takes no arguments, got %q", pos)
	}
	if c.traceFile != "" {
		// A file that grows for as long as the console runs is no way to trace a server.
		return usagef("--trace-file is for the one-shot commands, not serve")
	}
	if c.sessionConsumer {
		// The console recognises a session entity at its first read, and then shows its held sessions.
		return usagef("--session-consumer is for the one-shot commands, not serve: serve recognises a session entity by itself and shows its held sessions; give it without the flag")
	}
	if c.queue != "" || c.topic != "" || c.subscription != "" {
		e, err := c.entity()
		if err != nil {
			return err
		}
		ce := console.Entity{Path: e.Path(), RetryQueue: c.retryQueue}
		if e.IsSubscription() && c.retryQueue == "" {
			// A subscription without a retry queue is a session consumer's (it retries in place).
			ce.SessionConsumer = true
		}
		if *wakeTo != "" {
			if !e.IsSubscription() || c.retryQueue != "" {
				return usagef("--wake-to names the topic a session subscription's releases send their wake-ups to: give it with --topic T --subscription S and no --retry-queue")
			}
			ce.WakeTo = *wakeTo
		}
		entities = append(entities, ce)
	} else if *wakeTo != "" {
		return usagef("--wake-to goes with --topic T --subscription S (a session subscription)")
	}
	if len(entities) == 0 {
		return usagef("serve needs at least one entity: --queue Q, --topic T --subscription S --retry-queue R (or, for a session subscription, no --retry-queue), or --entity PATH[=RETRYQUEUE] (repeatable)")
	}
	if *maxAttempts < 0 {
		return usagef("--max-attempts %d is negative", *maxAttempts)
	}
	// The consumers' MaxAttempts, so that the search page says "attempt n of m".
	for i := range entities {
		entities[i].MaxAttempts = *maxAttempts
	}
	if *token == "" {
		*token = a.getenv(envConsoleToken)
	}
	var tokens []console.Token
	if *tokensFile != "" {
		if *token != "" {
			return usagef("give --token (or %s) or --tokens-file, not both", envConsoleToken)
		}
		if tokens, err = readTokensFile(*tokensFile); err != nil {
			return err
		}
	}
	if err := checkListen(*listen, *token != "" || len(tokens) > 0); err != nil {
		return err
	}
	connStr := c.connStr
	if connStr == "" {
		connStr = a.getenv(envConnectionString)
	}
	if connStr == "" {
		return usagef("no connection string: give --connection-string or set %s", envConnectionString)
	}
	client, err := azservicebus.NewClientFromConnectionString(connStr, &azservicebus.ClientOptions{RetryOptions: clientRetries})
	if err != nil {
		return fmt.Errorf("connection string: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		_ = client.Close(cctx)
	}()
	// --index answers the console's search and its pages from a retry-state index (a file, opened
	// read-only, or a PostgreSQL URL), as status and pending --index answer from it; --index-dedicated
	// says it holds the one entity's events only (console.Options.IndexDedicated, deprecated: the pages
	// of a shared index are as fast). Its name in output
	// never holds a password.
	var idx console.Index
	indexName := ""
	if *index != "" {
		if c.timeout <= 0 {
			return usagef("--timeout must be positive")
		}
		octx, cancel := context.WithTimeout(ctx, c.timeout)
		store, name, err := openIndex(octx, *index)
		cancel()
		if err != nil {
			return err
		}
		defer func() { _ = store.Close() }()
		idx, indexName = store, name
	}
	con, err := console.New(client, entities, &console.Options{
		PollInterval: *poll, Window: *window, MaxPeek: c.maxPeek, ShowBodies: *bodies, FilterBodies: *filterBodies, AccessToken: *token,
		Tokens: tokens, AuditFile: *auditFile, Logger: slog.New(slog.NewTextHandler(a.stderr, nil)), Index: idx,
		IndexDedicated: *indexDedicated,
	})
	if err != nil {
		if errors.Is(err, console.ErrInvalidOptions) || errors.Is(err, inspect.ErrInvalidEntity) {
			return usagef("%v", err)
		}
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", *listen, err)
	}
	// Without a token the console answers only to loopback Host names (console.Options.AllowedHosts),
	// its guard against DNS rebinding. An action may run for console.DefaultActionTimeout, so writes
	// are not bounded here; reads and idle connections are.
	srv := &http.Server{Handler: con, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	polled := make(chan error, 1)
	go func() { polled <- con.Run(ctx) }()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(a.stderr, "sbretry: console on http://%s/ (%d entities); interrupt to stop\n", ln.Addr(), len(entities))
	if indexName != "" {
		fmt.Fprintf(a.stderr, "sbretry: the console's search answers from index %s\n", indexName)
	} else {
		fmt.Fprintf(a.stderr, "sbretry: the console's search reads each entity up to --max-peek %d messages (give --index for a retry-state index)\n", c.maxPeek)
	}
	if a.hooks.serving != nil {
		a.hooks.serving(ln.Addr().String())
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	shutErr := srv.Shutdown(sctx)
	stop()
	<-polled
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", serveErr)
	}
	if shutErr != nil {
		return fmt.Errorf("stopping the console: requests still running after %v: %w", shutdownTimeout, shutErr)
	}
	return nil
}

var _ flag.Value = (*entityList)(nil)
