package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// frontDoor is one TLS port that serves what a real namespace serves on one host: AMQP (amqps://host/)
// and the administration API (https://host/). The SDK puts a port given in the endpoint on both URLs,
// while sbemu listens on two ports (plain AMQP and HTTPS admin), so the front door terminates TLS with
// a test CA, reads the first bytes and hands the connection on: "AMQP" (the protocol header every
// AMQP connection starts with) to the emulator's AMQP port as a byte pipe, anything else to an HTTP
// server that forwards each request to the admin port.
type frontDoor struct {
	ln      net.Listener
	amqp    string // the emulator's plain AMQP address
	httpLn  *chanListener
	httpSrv *http.Server
	wg      sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{} // open pipes, closed by Close
}

// newFrontDoor listens on a free loopback port with a certificate signed by itself, and returns the
// door and that certificate in PEM form (the CA the SDK must trust). amqpAddr is the emulator's plain
// AMQP address; adminEndpoint and adminTransport reach its admin API.
func newFrontDoor(amqpAddr string, adminEndpoint string, adminTransport http.RoundTripper) (*frontDoor, []byte, error) {
	target, err := url.Parse(adminEndpoint)
	if err != nil {
		return nil, nil, err
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	// go-amqp asks for the namespace with its port as the TLS server name ("127.0.0.1:43210"), which
	// crypto/x509 matches exactly against the DNS names, so the certificate names the address too.
	cert, caPEM, err := selfSignedCert(tcp.Addr().String())
	if err != nil {
		_ = tcp.Close()
		return nil, nil, err
	}
	d := &frontDoor{
		ln:     tls.NewListener(tcp, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}),
		amqp:   amqpAddr,
		httpLn: newChanListener(tcp.Addr()),
		conns:  map[net.Conn]struct{}{},
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			// The admin API writes the host it was asked for into its answers (entity ids,
			// forwarding addresses), as Service Bus does: keep the one the SDK used.
			r.Out.Host = r.In.Host
		},
		Transport: adminTransport,
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	d.httpSrv = &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		_ = d.httpSrv.Serve(d.httpLn)
	}()
	go d.acceptLoop()
	return d, caPEM, nil
}

// Addr is the door's address, "127.0.0.1:port": the namespace the SDK is pointed at.
func (d *frontDoor) Addr() string { return d.ln.Addr().String() }

// Close stops accepting, cuts every open connection and waits for the door's goroutines.
func (d *frontDoor) Close() {
	_ = d.ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := d.httpSrv.Shutdown(ctx); err != nil {
		_ = d.httpSrv.Close()
	}
	d.mu.Lock()
	for c := range d.conns {
		_ = c.Close()
	}
	d.conns = nil
	d.mu.Unlock()
	d.wg.Wait()
}

func (d *frontDoor) acceptLoop() {
	defer d.wg.Done()
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		if !d.track(c) {
			_ = c.Close()
			return
		}
		d.wg.Add(1)
		go d.route(c)
	}
}

// track records an open connection; it reports false once the door is closing.
func (d *frontDoor) track(c net.Conn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conns == nil {
		return false
	}
	d.conns[c] = struct{}{}
	return true
}

func (d *frontDoor) untrack(c net.Conn) {
	d.mu.Lock()
	delete(d.conns, c)
	d.mu.Unlock()
}

// route reads the first four bytes of a connection (after the TLS handshake) and sends it to AMQP or
// HTTP. The handshake and the first bytes must come within ten seconds.
func (d *frontDoor) route(c net.Conn) {
	defer d.wg.Done()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	head, err := br.Peek(4)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		d.untrack(c)
		_ = c.Close()
		return
	}
	pc := &peekedConn{Conn: c, r: br}
	if string(head) != "AMQP" {
		// The HTTP server owns it from here; Shutdown and Close end it.
		d.untrack(c)
		if !d.httpLn.deliver(pc) {
			_ = c.Close()
		}
		return
	}
	defer d.untrack(c)
	defer c.Close()
	up, err := net.DialTimeout("tcp", d.amqp, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, pc)
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	_, _ = io.Copy(c, up)
	_ = c.Close() // ends the other copy if the emulator hung up first
	<-done
}

// peekedConn is a connection whose first bytes sit in a bufio.Reader.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (p *peekedConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// chanListener is a [net.Listener] fed by the front door with the connections that speak HTTP.
type chanListener struct {
	addr   net.Addr
	ch     chan net.Conn
	done   chan struct{}
	closed sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

// deliver hands c to the listener's Accept; it reports false if the listener is closed.
func (l *chanListener) deliver(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.closed.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// selfSignedCert makes a CA certificate for 127.0.0.1, localhost and addr, valid for a day around now,
// and returns it for the server and in PEM form for clients to trust.
func selfSignedCert(addr string) (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "sdklive test CA"},
		DNSNames:              []string{"localhost", addr},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
