package sbemu

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
)

// EndpointsFile is the file in [Config.DataDir] where a running emulator
// says where it listens, for clients in other processes (see
// [ReadEndpoints] and [AdminClientOptionsFromDir]). Start writes it once
// both listeners are up; Close removes it. It holds no secret: the key
// stays in the connection string. A SIGKILL leaves it behind; the next
// start on the directory replaces it.
const EndpointsFile = "endpoints.json"

// Endpoints is the content of [EndpointsFile]: where one run of an
// emulator listens.
type Endpoints struct {
	// AMQPAddr is the AMQP listener's address, host:port, as in the
	// Endpoint=sb://… of [Emulator.ConnectionString].
	AMQPAddr string `json:"amqpAddr"`
	// AdminAddr is the administration API's address, host:port.
	AdminAddr string `json:"adminAddr"`
	// AdminEndpoint is the administration API's base URL, as
	// [Emulator.AdminEndpoint] returns it.
	AdminEndpoint string `json:"adminEndpoint"`
	// AdminCAFile names the certificate authority to trust, relative to
	// the directory: [AdminCAFile].
	AdminCAFile string `json:"adminCAFile"`
	// AdminServerName is a name the admin API's certificate is valid for
	// whatever address it listens on; the loopback addresses, localhost
	// and the listen host are valid too.
	AdminServerName string `json:"adminServerName"`
}

// ReadEndpoints reads the [EndpointsFile] of an emulator running with
// [Config.DataDir] (cmd/sbemu -data) set to dir. Its error says when no
// emulator has announced itself there.
func ReadEndpoints(dir string) (Endpoints, error) {
	path := filepath.Join(dir, EndpointsFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Endpoints{}, fmt.Errorf("sbemu: no %s: no emulator is running with the data directory %s", path, dir)
	}
	if err != nil {
		return Endpoints{}, fmt.Errorf("sbemu: reading %s: %w", path, err)
	}
	var ep Endpoints
	if err := json.Unmarshal(data, &ep); err != nil {
		return Endpoints{}, fmt.Errorf("sbemu: %s is not an endpoints file: %w", path, err)
	}
	if _, _, err := net.SplitHostPort(ep.AdminAddr); err != nil {
		return Endpoints{}, fmt.Errorf("sbemu: %s names no admin address: %w", path, err)
	}
	return ep, nil
}

// writeEndpoints writes the [EndpointsFile] of a running emulator with a
// DataDir and sockets.
func (e *Emulator) writeEndpoints() error {
	ep := Endpoints{
		AMQPAddr:        e.ln.Addr().String(),
		AdminAddr:       e.admin.ln.Addr().String(),
		AdminEndpoint:   e.AdminEndpoint(),
		AdminCAFile:     AdminCAFile,
		AdminServerName: adminServerName,
	}
	data, err := json.MarshalIndent(ep, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(e.cfg.DataDir, EndpointsFile)
	if err := writeFileAtomic(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("sbemu: writing %s: %w", EndpointsFile, err)
	}
	e.log.Info("sbemu: endpoints written for other processes", "file", path, "adminCA", filepath.Join(e.cfg.DataDir, AdminCAFile))
	return nil
}

// removeEndpoints removes the [EndpointsFile] at Close, so a client finds
// out that the emulator is gone rather than dialing a dead port.
func (e *Emulator) removeEndpoints() {
	if e.cfg.DataDir == "" || e.cfg.InMemory {
		return
	}
	if err := os.Remove(filepath.Join(e.cfg.DataDir, EndpointsFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.Warn("sbemu: removing the endpoints file", "err", err)
	}
}

// AdminClientOptionsFromDir returns options for
// admin.NewClientFromConnectionString that reach the administration API of
// an emulator in another process, one running with [Config.DataDir]
// (cmd/sbemu -data) set to dir, the way [Emulator.AdminClientOptions] does
// in-process:
//
//	opts, err := sbemu.AdminClientOptionsFromDir("./sbemu-data")
//	ac, err := admin.NewClientFromConnectionString(connStr, opts) // connStr as cmd/sbemu printed it
//	m, err := dlqmonitor.New(ac, []string{"orders"}, nil)
//
// Each new connection reads the directory's [EndpointsFile] and
// [AdminCAFile] afresh, so the options keep working across restarts of the
// emulator, even when its admin port changes (a stopping emulator closes
// its connections, so the next request connects anew); the certificate
// authority is kept in the directory, so it stays the same. Idle
// connections close after 30 seconds: nothing needs closing. A failure to
// connect names the admin endpoint and the file it came from.
//
// It fails at once when dir holds no certificate authority (no emulator
// ever ran with it); an emulator that is merely stopped makes the requests
// fail instead, until it is back.
func AdminClientOptionsFromDir(dir string) (*admin.ClientOptions, error) {
	if _, err := readAdminCAPool(dir); err != nil {
		return nil, err
	}
	var dialer net.Dialer
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialAdminFromDir(ctx, &dialer, dir)
		},
		TLSHandshakeTimeout: 10 * time.Second,
		// Kept-alive connections make a request about 0.5 ms instead of
		// about 26 ms with a connection each (BenchmarkPollFromDir in
		// dlqmonitor, loopback); they close after IdleConnTimeout, or when
		// the emulator stops, so nothing is left for the caller to close.
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	return &admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: &http.Client{Transport: tr, Timeout: time.Minute}}}, nil
}

// dialAdminFromDir connects to the admin API that dir's endpoints file
// names and completes the TLS handshake against dir's certificate
// authority.
func dialAdminFromDir(ctx context.Context, dialer *net.Dialer, dir string) (net.Conn, error) {
	ep, err := ReadEndpoints(dir)
	if err != nil {
		return nil, err
	}
	pool, err := readAdminCAPool(dir)
	if err != nil {
		return nil, err
	}
	where := fmt.Sprintf("sbemu: admin API at %s (from %s)", ep.AdminEndpoint, filepath.Join(dir, EndpointsFile))
	nc, err := dialer.DialContext(ctx, "tcp", ep.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	tc := tls.Client(nc, &tls.Config{RootCAs: pool, ServerName: adminServerName, MinVersion: tls.VersionTLS12})
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("%s, trusting %s: %w", where, filepath.Join(dir, AdminCAFile), err)
	}
	return tc, nil
}

// readAdminCAPool reads dir's [AdminCAFile] into a pool.
func readAdminCAPool(dir string) (*x509.CertPool, error) {
	path := filepath.Join(dir, AdminCAFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("sbemu: no %s: no emulator has run with the data directory %s", path, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("sbemu: reading %s: %w", path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("sbemu: %s holds no PEM certificate", path)
	}
	return pool, nil
}
