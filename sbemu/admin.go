package sbemu

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
)

// The administration API: the HTTPS/ATOM endpoint that the SDK's admin
// client (github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin)
// and the JavaScript and Python administration clients use to create, read,
// update and delete entities and to read their runtime counts.
//
// How the SDK reaches a namespace (azservicebus v1.11.0, internal/atom/
// entity_manager.go, newEntityManagerImpl and execute): the base URL is
// always "https://" + the connection string's host (with its port, if any)
// + "/", whatever UseDevelopmentEmulator says; every request carries
// api-version=2024-05 as a query parameter and, from
// internal/atom/per_retry_auth_policy.go, an Authorization header holding
// a SAS token whose audience is the full request URL. An emulator
// connection string names the AMQP port, which speaks plain AMQP, so the
// admin client cannot reach the emulator by its URL alone: the emulator
// serves the API over TLS on a port of its own and hands out an HTTP
// transport ([Emulator.AdminClientOptions], [Emulator.AdminHTTPClient])
// that sends every request, whatever its URL, to that port and trusts the
// emulator's certificate authority (admin_cert.go); a client in another
// process gets the same from the data directory with
// [AdminClientOptionsFromDir] (endpoints.go).

// adminServerName is the TLS server name the emulator's own transport asks
// for; the certificate also names 127.0.0.1, ::1, localhost, the listen
// host and [InMemoryHost], for clients that connect by address.
const adminServerName = "sbemu-admin.localhost"

// adminServer is the HTTPS side of an emulator.
type adminServer struct {
	e       *Emulator
	ln      net.Listener
	mem     *memListener // with Config.InMemory; nil otherwise
	srv     *http.Server
	pool    *x509.CertPool // holds ca's certificate only
	ca      *adminCA       // signs the server certificate (admin_cert.go)
	started time.Time
	served  chan struct{} // closed when Serve has returned

	// mu serialises changes, so that "exists?" and "create" are one step,
	// and guards meta and transports.
	mu         sync.Mutex
	meta       map[string]*entityMeta // by lower-case entity path
	transports []*http.Transport
}

// entityMeta is what the broker does not keep but the API reports.
type entityMeta struct {
	created, updated time.Time
	echoedSettings   // admin_echoed.go
}

// startAdmin loads or creates the certificate authority, makes the server
// certificate and starts serving the API on
// cfg.AdminAddr (or in memory).
func (e *Emulator) startAdmin() error {
	a := &adminServer{e: e, meta: map[string]*entityMeta{}, served: make(chan struct{}), started: e.cfg.Clock.Now()}
	host := ""
	if !e.cfg.InMemory {
		host, _, _ = net.SplitHostPort(e.ln.Addr().String())
	}
	ca, err := loadOrCreateAdminCA(e.cfg.DataDir, e.log)
	if err != nil {
		return err
	}
	cert, err := ca.serverCertificate(host)
	if err != nil {
		return fmt.Errorf("sbemu: creating the admin API certificate: %w", err)
	}
	a.ca = ca
	a.pool = x509.NewCertPool()
	a.pool.AddCert(ca.cert)
	if e.cfg.InMemory {
		a.mem = newMemListener()
		a.ln = a.mem
	} else if a.ln, err = net.Listen("tcp", e.cfg.AdminAddr); err != nil {
		return fmt.Errorf("sbemu: listening for the admin API on %s: %w", e.cfg.AdminAddr, err)
	}
	a.srv = &http.Server{
		Handler:           http.HandlerFunc(a.serveHTTP),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelDebug),
	}
	e.admin = a
	go func() {
		defer close(a.served)
		if err := a.srv.ServeTLS(a.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Warn("sbemu: admin API stopped", "err", err)
		}
	}()
	e.log.Info("sbemu: admin API listening", "addr", a.ln.Addr().String())
	return nil
}

// stopAdmin closes the server, its connections and the idle connections of
// every transport handed out, and waits for the serving goroutine and for
// requests in flight (at most two seconds).
func (e *Emulator) stopAdmin() {
	a := e.admin
	if a == nil {
		return
	}
	// Shutdown lets requests in flight finish (their handlers touch the
	// broker, which closes next); Close cuts whatever is left after a
	// bounded wait.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		_ = a.srv.Close()
	}
	<-a.served
	a.mu.Lock()
	transports := a.transports
	a.mu.Unlock()
	for _, t := range transports {
		t.CloseIdleConnections()
	}
}

// AdminEndpoint is the base URL the administration API is served on, such
// as "https://127.0.0.1:50123/"; with [Config.InMemory] it names
// [InMemoryHost] and is reachable only through [Emulator.AdminHTTPClient].
// Clients other than the Go SDK (JavaScript, Python, curl) can use its host
// as the namespace if they trust [Emulator.AdminRootCAs].
func (e *Emulator) AdminEndpoint() string {
	if e.admin.mem != nil {
		return "https://" + InMemoryHost + "/"
	}
	return "https://" + e.admin.ln.Addr().String() + "/"
}

// AdminCertificatePEM returns, in PEM form, the certificate authority that
// signs the admin API's server certificate: the one certificate a client
// needs to trust, for clients that read trust anchors from a file
// (NODE_EXTRA_CA_CERTS for the JavaScript SDK, REQUESTS_CA_BUNDLE or
// SSL_CERT_FILE for Python, curl --cacert). With [Config.DataDir] it is the
// [AdminCAFile] kept there, the same across restarts on that directory;
// without, it is made at start. It is public: it holds no private key.
func (e *Emulator) AdminCertificatePEM() []byte { return e.admin.ca.certPEM() }

// AdminRootCAs returns a pool holding the certificate authority of
// [Emulator.AdminCertificatePEM].
func (e *Emulator) AdminRootCAs() *x509.CertPool { return e.admin.pool.Clone() }

// AdminHTTPClient returns an HTTP client that sends every request, whatever
// host its URL names, to the emulator's admin API, and trusts its
// certificate. [Emulator.Close] closes its idle connections.
func (e *Emulator) AdminHTTPClient() *http.Client {
	a := e.admin
	var dialer net.Dialer
	addr := a.ln.Addr().String()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if a.mem != nil {
				return a.mem.dial(ctx)
			}
			return dialer.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig:     &tls.Config{RootCAs: a.pool, ServerName: adminServerName, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	a.mu.Lock()
	a.transports = append(a.transports, tr)
	a.mu.Unlock()
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// AdminClientOptions returns options for admin.NewClientFromConnectionString
// (or admin.NewClient) that reach this emulator's administration API:
//
//	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
//
// The SDK builds its URLs from the connection string's host; the transport
// from [Emulator.AdminHTTPClient] delivers them to the admin port instead.
// Retries keep the SDK's defaults.
func (e *Emulator) AdminClientOptions() *admin.ClientOptions {
	return &admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: e.AdminHTTPClient()}}
}
