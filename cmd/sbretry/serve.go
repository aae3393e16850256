package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
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
// loopback address (an empty host listens on every interface).
func checkListen(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--listen %q: %v", addr, err)
	}
	if console.IsLoopbackHost(host) || token != "" {
		return nil
	}
	return usagef("--listen %s is not a loopback address: give --token (or set %s), which every request must then present", addr, envConsoleToken)
}

// serve runs the web console (package console) for the entities given, on --listen, until the
// command is interrupted.
func (a *app) serve(ctx context.Context, args []string) error {
	var c common
	var entities entityList
	fs := newFlagSet("serve", &c)
	listen := fs.String("listen", defaultListen, "")
	token := fs.String("token", "", "")
	fs.Var(&entities, "entity", "")
	poll := fs.Duration("poll-interval", console.DefaultPollInterval, "")
	window := fs.Duration("window", console.DefaultWindow, "")
	bodies := fs.Bool("show-bodies", false, "")
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
		// The console shows retry queues and their pending retries, which a session consumer has none of.
		return usagef("--session-consumer is for the one-shot commands, not serve: the console reads a consumer's retry queue, and a session consumer has none")
	}
	if c.queue != "" || c.topic != "" || c.subscription != "" {
		e, err := c.entity()
		if err != nil {
			return err
		}
		entities = append(entities, console.Entity{Path: e.Path(), RetryQueue: c.retryQueue})
	}
	if len(entities) == 0 {
		return usagef("serve needs at least one entity: --queue Q, --topic T --subscription S --retry-queue R, or --entity PATH[=RETRYQUEUE] (repeatable)")
	}
	if *token == "" {
		*token = a.getenv(envConsoleToken)
	}
	if err := checkListen(*listen, *token); err != nil {
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
	con, err := console.New(client, entities, &console.Options{
		PollInterval: *poll, Window: *window, MaxPeek: c.maxPeek, ShowBodies: *bodies, AccessToken: *token,
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
