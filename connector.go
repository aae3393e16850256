package retry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbretry/retry/internal/entitycheck"
	"github.com/sbretry/retry/internal/redact"
)

// Connection is one live client: the receiver the consumer reads from and the sender its retry copies go
// to. They are kept apart so that a topic subscription (receive from the subscription, republish
// elsewhere) and split rights (a listen-only key for receiving, another for sending) fit the same shape.
type Connection struct {
	Receiver Receiver
	// Sender is the republish target.
	Sender Sender
	// EntityPath is the entity Receiver reads from (a queue, or "topic/Subscriptions/sub"); it names
	// retry chains (see Options.EntityPath, which it overrides when set).
	EntityPath string
	// Sources lists more entities the consumer receives from on this connection, with the same handler,
	// concurrency limit and health: a subscription's retry queue, to which Sender schedules the copies.
	// Closing the connection must close their receivers too (Close, or their own Close when Close is nil).
	Sources []Source
	// Close releases the client behind Receiver and Sender. Nil means closing Receiver and Sender.
	Close func(ctx context.Context) error
	// Check, if set, proves that the connection works before the consumer counts it as connected. The
	// SDK connects lazily, so building a client succeeds even while the namespace is unreachable;
	// without a check the consumer would report itself running until its first receive failed. A
	// failing Check counts as a failed connect: the connection is closed and the reconnect schedule
	// goes on. The connector call and its Check together run bounded by 10 s (or the settle timeout if
	// shorter). The built-in connectors' check also proves the right to send to the republish target,
	// so a listen-only key is refused before a message is touched.
	Check func(ctx context.Context) error
	// Settings, if set, reads the entity's settings and returns warnings about those that weaken the crash
	// contract (duplicate detection off or too short a window, a low MaxDeliveryCount), given the
	// consumer's settle timeout; each warning names the entity whose setting it is. The consumer calls it
	// once after its first connect and reports the warnings in its log and in Health.Warnings. An error
	// (the administration API is not reachable, or the credential lacks Manage rights) means the settings
	// are unknown: the consumer runs on, and says so in its log and in Health.Warnings, naming the entity
	// and the error, which should name the endpoint it could not read. The one exception is an error
	// wrapping [ErrSessionEntity], returned with the warnings: the entity requires sessions, and Run
	// returns that error unless Options.AllowReorder is set (see there).
	Settings func(ctx context.Context, settleTimeout time.Duration) ([]string, error)
	// Ping, if set, is a cheap liveness probe (the built-in connectors peek at one message). The
	// consumer calls it when the connection has been quiet for a few seconds or the SDK reported a
	// dropped link, so that an outage shows in Health within seconds. Nil means Check.
	Ping func(ctx context.Context) error
	// Address is the namespace endpoint the connection talks to, as host:port ("ns.servicebus.windows.net:5671"),
	// for telemetry (server.address and server.port); the built-in connectors set it. Empty means unknown.
	Address string
}

// Source is one entity a [Connection] receives from.
type Source struct {
	Receiver Receiver
	// EntityPath names the entity (a queue, or "topic/Subscriptions/sub").
	EntityPath string
}

// close releases c, bounded by ctx.
func (c *Connection) close(ctx context.Context) error {
	if c.Close != nil {
		return c.Close(ctx)
	}
	errs := []error{c.Receiver.Close(ctx), c.Sender.Close(ctx)}
	for _, s := range c.Sources {
		if s.Receiver != nil {
			errs = append(errs, s.Receiver.Close(ctx))
		}
	}
	return errors.Join(errs...)
}

// Connector builds a fresh Connection. The consumer calls it at start and after the connection broke;
// a broken connection is closed and never reused, because the SDK's recovery cannot always heal a client
// whose connection was lost.
type Connector func(ctx context.Context) (*Connection, error)

// ConnectOptions tunes the connectors taken from a [Namespace].
type ConnectOptions struct {
	// Client is passed to the azservicebus client constructor.
	Client *azservicebus.ClientOptions
	// Receiver is passed to NewReceiverForQueue. ReceiveMode is always PeekLock: retries need it.
	Receiver *azservicebus.ReceiverOptions
	// SendConnectionString, for [NewNamespace], is a separate connection string for the
	// republish target, for namespaces where listen and send rights are split between two keys. Empty
	// means the receiving connection string, which then needs both rights.
	SendConnectionString string
	// SendCredential, for [NewNamespaceCredential], is a separate credential for the republish target. Nil
	// means the receiving credential.
	SendCredential azcore.TokenCredential
	// CheckSettings makes the connection read the entity's settings through the administration API at
	// start and warn about those that weaken the crash contract (see [Connection.Settings]). It needs a
	// credential with Manage rights and a reachable administration endpoint (https://<namespace>/);
	// without them the check cannot run, which the consumer reports as a warning naming the entity and
	// the endpoint. An entity that requires sessions is refused (see Options.AllowReorder).
	CheckSettings bool
	// Admin is passed to the administration client CheckSettings uses (for the emulator:
	// sbemu's AdminClientOptions).
	Admin *admin.ClientOptions
}

// settingsCheck returns a Connection.Settings for entity (with its retry queue, for a subscription)
// through an administration client made by newAdmin, which addresses endpoint, or nil when opts does
// not ask for it. Each warning starts with the path of the entity whose setting it is; an error names
// the entity and the endpoint.
func settingsCheck(opts *ConnectOptions, entity, retryQueue, endpoint string, emulator bool, newAdmin func(*admin.ClientOptions) (*admin.Client, error)) func(context.Context, time.Duration) ([]string, error) {
	if opts == nil || !opts.CheckSettings {
		return nil
	}
	return func(ctx context.Context, settleTimeout time.Duration) ([]string, error) {
		if emulator && (opts.Admin == nil || opts.Admin.Transport == nil) {
			// The SDK would address the administration API at the Endpoint, the emulator's AMQP port,
			// and fail after its retries with a bare EOF: say at once where to point it instead.
			return nil, fmt.Errorf("retry: reading the settings of %s through the administration API at %s: %w", entity, endpoint, errEmulatorAdmin)
		}
		ac, err := newAdmin(opts.Admin)
		if err == nil {
			var ws []entitycheck.Warning
			if ws, err = entitycheck.Check(ctx, ac, entity, &entitycheck.Options{SettleTimeout: settleTimeout, RetryQueue: retryQueue}); err == nil {
				out := make([]string, 0, len(ws))
				var session error
				for _, w := range ws {
					if w.Code == entitycheck.RequiresSession {
						session = fmt.Errorf("%w (%s: RequiresSession is set)", ErrSessionEntity, w.Entity)
						continue
					}
					out = append(out, w.Entity+": "+w.Message)
				}
				return out, session
			}
		}
		return nil, redact.Wrap(fmt.Errorf("retry: reading the settings of %s through the administration API at %s: %w", entity, endpoint, err))
	}
}

// errEmulatorAdmin is the settings check's error for a development emulator's connection string
// without ConnectOptions.Admin.
var errEmulatorAdmin = errors.New("retry: CheckSettings with a development emulator (UseDevelopmentEmulator=true) needs ConnectOptions.Admin " +
	"to reach its administration API, which is not on the AMQP port of the Endpoint: for sbemu, " +
	"Emulator.AdminClientOptions() in the same process or sbemu.AdminClientOptionsFromDir(dataDir) in another; " +
	"for an emulator without one, leave CheckSettings off")

// clients makes the clients of one connection, the same way for every connector: the name is looked up
// first (see resolveHost), the receiving client is made, and the republishing client is the same one
// unless ConnectOptions names other rights for it.
type clients struct {
	host, addr string
	// emulator is set for a connection string with UseDevelopmentEmulator=true, whose administration
	// API is not where the Endpoint points.
	emulator  bool
	adminURL  string // the administration endpoint the admin client addresses, for messages
	opts      *azservicebus.ClientOptions
	newClient func() (*azservicebus.Client, error)
	newSender func() (*azservicebus.Client, error) // nil: the receiving client sends too
	newAdmin  func(*admin.ClientOptions) (*admin.Client, error)
}

// connectionStringClients validates the connection strings at once and returns their clients.
func connectionStringClients(connectionString string, opts *ConnectOptions) (*clients, error) {
	cl := &clients{}
	sendString := ""
	if opts != nil {
		cl.opts = opts.Client
		sendString = opts.SendConnectionString
	}
	if err := validateConnectionString(connectionString); err != nil {
		return nil, err
	}
	cl.host, cl.addr, cl.emulator = connectionStringEndpoint(connectionString)
	cl.newClient = func() (*azservicebus.Client, error) {
		return azservicebus.NewClientFromConnectionString(connectionString, cl.opts)
	}
	if sendString != "" {
		if err := validateConnectionString(sendString); err != nil {
			return nil, err
		}
		cl.newSender = func() (*azservicebus.Client, error) {
			return azservicebus.NewClientFromConnectionString(sendString, cl.opts)
		}
	}
	cl.newAdmin = func(o *admin.ClientOptions) (*admin.Client, error) {
		return admin.NewClientFromConnectionString(connectionString, o)
	}
	cl.adminURL = "https://" + connectionStringNamespace(connectionString) + "/"
	return cl, nil
}

// credentialClients returns the clients of namespace with an Entra ID credential.
func credentialClients(namespace string, credential azcore.TokenCredential, opts *ConnectOptions) (*clients, error) {
	switch {
	case namespace == "":
		return nil, &OptionError{Field: "namespace", Reason: "must not be empty"}
	case credential == nil:
		return nil, &OptionError{Field: "credential", Reason: "must not be nil"}
	}
	cl := &clients{host: namespace}
	if u, err := url.Parse(namespace); err == nil && u.Host != "" {
		cl.host = u.Host
	}
	cl.addr = net.JoinHostPort(cl.host, "5671")
	if opts != nil {
		cl.opts = opts.Client
		if send := opts.SendCredential; send != nil {
			cl.newSender = func() (*azservicebus.Client, error) { return azservicebus.NewClient(namespace, send, cl.opts) }
		}
	}
	cl.newClient = func() (*azservicebus.Client, error) { return azservicebus.NewClient(namespace, credential, cl.opts) }
	cl.newAdmin = func(o *admin.ClientOptions) (*admin.Client, error) { return admin.NewClient(namespace, credential, o) }
	cl.adminURL = "https://" + cl.host + "/"
	return cl, nil
}

// open makes the receiving and the republishing client.
func (cl *clients) open(ctx context.Context) (client, sendClient *azservicebus.Client, err error) {
	if err := resolveHost(ctx, cl.host, cl.opts); err != nil {
		return nil, nil, err
	}
	if err := reachEndpoint(ctx, cl.addr, cl.opts); err != nil {
		return nil, nil, err
	}
	if client, err = cl.newClient(); err != nil {
		return nil, nil, redact.Wrap(fmt.Errorf("retry: creating client: %w", err))
	}
	sendClient = client
	if cl.newSender != nil {
		if sendClient, err = cl.newSender(); err != nil {
			_ = client.Close(ctx)
			return nil, nil, redact.Wrap(fmt.Errorf("retry: creating the republish client: %w", err))
		}
	}
	return client, sendClient, nil
}

// connector returns the Connector that opens the clients, builds the connection with build, and gives
// it the settings check of entity (and retryQueue) when opts asks for one.
func (cl *clients) connector(opts *ConnectOptions, entity, retryQueue string, build func(ctx context.Context, client, sendClient *azservicebus.Client) (*Connection, error)) Connector {
	return func(ctx context.Context) (*Connection, error) {
		client, sendClient, err := cl.open(ctx)
		if err != nil {
			return nil, err
		}
		conn, err := build(ctx, client, sendClient)
		if conn != nil {
			conn.Settings = settingsCheck(opts, entity, retryQueue, cl.adminURL, cl.emulator, cl.newAdmin)
		}
		return conn, err
	}
}

// validateConnectionString parses s the way the SDK does, without connecting.
func validateConnectionString(s string) error {
	client, err := azservicebus.NewClientFromConnectionString(s, nil)
	if err != nil {
		return redact.Wrap(fmt.Errorf("%w: connection string: %w", ErrInvalidOptions, err))
	}
	_ = client.Close(context.Background())
	return nil
}

// closeClients returns the function that closes client and, if it is another one, sendClient: the
// Close of the connection, and what a connection that failed half-way through opening gives back.
func closeClients(client, sendClient *azservicebus.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		err := client.Close(ctx)
		if sendClient != client {
			err = errors.Join(err, sendClient.Close(ctx))
		}
		return err
	}
}

// peekLockOptions are the user's receiver options (ConnectOptions.Receiver) with the receive mode the
// consumer needs: PeekLock, since it settles every message itself.
func peekLockOptions(opts *ConnectOptions) azservicebus.ReceiverOptions {
	recvOpts := azservicebus.ReceiverOptions{}
	if opts != nil && opts.Receiver != nil {
		recvOpts = *opts.Receiver
	}
	recvOpts.ReceiveMode = azservicebus.ReceiveModePeekLock
	return recvOpts
}

// queueConnection opens the receiver of queue on client and its sender on sendClient (often the same
// client); on failure it closes both.
func queueConnection(ctx context.Context, client, sendClient *azservicebus.Client, queue, addr string, opts *ConnectOptions) (*Connection, error) {
	closeAll := closeClients(client, sendClient)
	recvOpts := peekLockOptions(opts)
	receiver, err := client.NewReceiverForQueue(queue, &recvOpts)
	if err != nil {
		_ = closeAll(ctx)
		return nil, redact.Wrap(fmt.Errorf("retry: creating receiver for %q: %w", queue, err))
	}
	sender, err := sendClient.NewSender(queue, nil)
	if err != nil {
		_ = closeAll(ctx)
		return nil, redact.Wrap(fmt.Errorf("retry: creating sender for %q: %w", queue, err))
	}
	ping := explainTimeouts(peekCheck(receiver), addr)
	return &Connection{
		Receiver:   receiver,
		Sender:     sender,
		EntityPath: queue,
		Close:      closeAll,
		Check: func(ctx context.Context) error {
			if err := ping(ctx); err != nil {
				return err
			}
			return sendCheck(ctx, sender)
		},
		Ping:    ping,
		Address: addr,
	}, nil
}

// explainDialTimeout bounds the TCP dial that explains a timed-out check.
const explainDialTimeout = 2 * time.Second

// explainTimeouts wraps a check so that a timeout says why when it can: the SDK retries a refused or
// unreachable connection until the context ends and then reports only the deadline, so on a deadline
// the wrapper dials the endpoint itself and adds that error ("connection refused", "no route to host").
func explainTimeouts(check func(ctx context.Context) error, addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		err := check(ctx)
		if err == nil || addr == "" || !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), explainDialTimeout)
		defer cancel()
		conn, dialErr := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
		if dialErr != nil {
			return fmt.Errorf("%w (the endpoint: %w)", err, dialErr)
		}
		_ = conn.Close()
		return fmt.Errorf("%w (the endpoint %s accepts connections but did not answer in time)", err, addr)
	}
}

// peekCheck peeks at one message: it opens the connection, authenticates and confirms that the queue
// exists and can be read, without locking or changing anything (an empty queue answers with no
// messages). It names the sequence number to start from: without one the SDK reads and writes the
// receiver's peek position unguarded, a data race when two receive loops probe one connection at once.
func peekCheck(receiver *azservicebus.Receiver) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		from := int64(1)
		_, err := receiver.PeekMessages(ctx, 1, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
		return err
	}
}

// PropProbe marks the message the connection check schedules to prove the right to send. The check
// cancels it at once; if the cancel is lost, the processor completes the probe without calling the
// handler when it comes due. Its value is [ProbeValue].
const (
	PropProbe  = "sbretry-probe"
	ProbeValue = "send-rights-check"
)

// probeDelay is how far ahead the probe is scheduled: far enough that it never activates before its
// cancellation, which follows at once.
const probeDelay = time.Hour

// sendCheck proves the right to send to the republish target without leaving a message behind: it
// schedules a marked probe an hour ahead and cancels it by its sequence number. A listen-only key fails
// here with CodeUnauthorizedAccess, before any message is received.
func sendCheck(ctx context.Context, sender *azservicebus.Sender) error {
	var id [12]byte
	_, _ = rand.Read(id[:])
	mid := probeIDPrefix + hex.EncodeToString(id[:])
	ttl := time.Minute
	probe := &azservicebus.Message{
		MessageID:             &mid,
		TimeToLive:            &ttl,
		ApplicationProperties: map[string]any{PropProbe: ProbeValue},
	}
	sctx, cancel := context.WithTimeout(ctx, sendCheckTimeout)
	defer cancel()
	seqs, err := sender.ScheduleMessages(sctx, []*azservicebus.Message{probe}, time.Now().Add(probeDelay), nil)
	if err != nil {
		err = fmt.Errorf("retry: checking the right to send to the republish target: %w", err)
		if startupError(err) != nil {
			return err // no right to send, or no such entity: retrying will not help
		}
		// A busy or slow management node proves nothing about the rights; the SDK would retry it for
		// longer than a connect may take. Go on, and say why in Health.
		return &CheckWarning{Err: err}
	}
	// The right to send is proven. A failed cancel must not fail the check: a retried check would leave
	// one more probe behind each time. The one left behind is completed unseen when it comes due.
	_ = sender.CancelScheduledMessages(ctx, seqs, nil)
	return nil
}

// sendCheckTimeout bounds the send-rights probe, well inside connectTimeout.
const sendCheckTimeout = 3 * time.Second

// CheckWarning is returned by a [Connection.Check] that found something worth reporting but not worth
// refusing the connection for, such as a send-rights probe that timed out or met a busy broker. The
// consumer then counts the connection as connected and puts the warning in Health.LastError.
type CheckWarning struct {
	Err error
}

func (w *CheckWarning) Error() string { return w.Err.Error() }

// Unwrap returns the underlying error.
func (w *CheckWarning) Unwrap() error { return w.Err }

// probeIDPrefix starts the MessageID of every send-rights probe.
const probeIDPrefix = "sbretry-probe-"

// isProbe reports a send-rights probe whose cancellation was lost: both its marker property and its
// MessageID say so, so a producer's message does not pass for one by accident.
func isProbe(msg *azservicebus.ReceivedMessage) bool {
	v, ok := msg.ApplicationProperties[PropProbe].(string)
	return ok && v == ProbeValue && strings.HasPrefix(msg.MessageID, probeIDPrefix)
}

// connectionStringNamespace is the host (and port, if given) of s's Endpoint, as the administration
// client addresses it.
func connectionStringNamespace(s string) string {
	for _, part := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(part, "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "Endpoint") {
			if u, err := url.Parse(strings.TrimSpace(v)); err == nil {
				return u.Host
			}
		}
	}
	return ""
}

// connectionStringEndpoint returns the host of a connection string's Endpoint and the address the SDK
// connects to: the Endpoint's port if it has one, else 5672 for the development emulator (plain AMQP)
// and 5671 (AMQP over TLS) otherwise. Both are empty if there is no Endpoint. emulator reports
// UseDevelopmentEmulator=true.
func connectionStringEndpoint(s string) (host, addr string, emulator bool) {
	port := "5671"
	for _, part := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case strings.EqualFold(k, "Endpoint"):
			if u, err := url.Parse(v); err == nil {
				host = u.Hostname()
				if p := u.Port(); p != "" {
					addr = net.JoinHostPort(host, p)
				}
			}
		case strings.EqualFold(k, "UseDevelopmentEmulator") && strings.EqualFold(v, "true"):
			port, emulator = "5672", true
		}
	}
	if host != "" && addr == "" {
		addr = net.JoinHostPort(host, port)
	}
	return host, addr, emulator
}

// reachEndpoint dials the endpoint's address before the SDK does: the SDK retries a refused or
// unreachable connection until its context ends (connectTimeout) and then reports only the deadline,
// so a stopped emulator or a closed port would be reported 10 s late, and as a timeout. A dial that
// fails says why at once ("connection refused"), and the consumer logs it and shows it in
// Health.LastError on its first try. With a custom dialer (ClientOptions.NewWebSocketConn) or a custom
// endpoint (ClientOptions.CustomEndpoint: a private link, a gateway) the SDK does not connect to addr,
// which is then not dialled.
func reachEndpoint(ctx context.Context, addr string, opts *azservicebus.ClientOptions) error {
	if addr == "" || (opts != nil && (opts.NewWebSocketConn != nil || opts.CustomEndpoint != "")) {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, explainDialTimeout)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("retry: the endpoint %s does not accept connections: %w", addr, err)
	}
	_ = conn.Close()
	return nil
}

// dnsTimeout bounds the name lookup that precedes each connect; it leaves most of connectTimeout to
// the connection itself.
const dnsTimeout = 3 * time.Second

// resolveHost looks host up before the SDK does: the SDK retries a failed lookup until its context
// ends, so a misspelled namespace would surface as "context deadline exceeded" instead of its cause.
// With a custom dialer (ClientOptions.NewWebSocketConn: a WebSocket proxy that resolves names itself,
// or an in-memory emulator) or a custom endpoint (ClientOptions.CustomEndpoint) the name need not
// resolve here, and is not looked up.
func resolveHost(ctx context.Context, host string, opts *azservicebus.ClientOptions) error {
	if host == "" || net.ParseIP(host) != nil || (opts != nil && (opts.NewWebSocketConn != nil || opts.CustomEndpoint != "")) {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	defer cancel()
	if _, err := net.DefaultResolver.LookupHost(lctx, host); err != nil {
		return fmt.Errorf("retry: resolving the namespace %q: %w", host, err)
	}
	return nil
}

// Namespace is a Service Bus namespace and how to reach it: the start of the built-in connectors, as
// an azservicebus.Client is of its receivers. Take a connector per entity from it ([Namespace.Queue],
// [Namespace.Subscription], [Namespace.SessionQueue], [Namespace.SessionSubscription]); each builds its
// own clients on every connect, so a broken connection is never reused.
//
//	connect, err := retry.NewNamespace(connectionString, nil).Queue("orders")
//
// A malformed connection string, a missing credential or an empty entity name is an error when the
// connector is taken, not a reconnect loop later. Errors never contain the shared access key.
type Namespace struct {
	cl   *clients
	opts *ConnectOptions
	err  error // what NewNamespace or NewNamespaceCredential found wrong; every connector returns it
}

// NewNamespace returns the namespace of connectionString. What is wrong with the connection string (or
// with opts' SendConnectionString) is returned by every connector taken from it.
func NewNamespace(connectionString string, opts *ConnectOptions) *Namespace {
	cl, err := connectionStringClients(connectionString, opts)
	return &Namespace{cl: cl, opts: opts, err: err}
}

// NewNamespaceCredential returns namespace (e.g. "myns.servicebus.windows.net") reached with an Entra
// ID credential such as azidentity's DefaultAzureCredential. An empty namespace or a nil credential is
// returned by every connector taken from it.
func NewNamespaceCredential(namespace string, credential azcore.TokenCredential, opts *ConnectOptions) *Namespace {
	cl, err := credentialClients(namespace, credential, opts)
	return &Namespace{cl: cl, opts: opts, err: err}
}

// Queue returns a Connector for queue.
func (n *Namespace) Queue(queue string) (Connector, error) {
	if n.err != nil {
		return nil, n.err
	}
	if queue == "" {
		return nil, &OptionError{Field: "queue", Reason: "must not be empty"}
	}
	cl, opts := n.cl, n.opts
	return cl.connector(opts, queue, "", func(ctx context.Context, client, sendClient *azservicebus.Client) (*Connection, error) {
		return queueConnection(ctx, client, sendClient, queue, cl.addr, opts)
	}), nil
}
