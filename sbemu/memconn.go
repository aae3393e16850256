package sbemu

import (
	"context"
	"net"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// The in-memory door: a client connection that is a net.Pipe instead of a
// socket, served by the same code as a TCP connection. The SDK accepts such
// a connection through ClientOptions.NewWebSocketConn, which hands it any
// net.Conn to speak AMQP over (azservicebus internal/namespace.go: with it
// set, the SDK calls amqp.NewConn on that conn instead of dialling, and adds
// no TLS of its own).
//
// It exists for testing/synctest: a goroutine blocked reading a pipe waits on
// a channel, which synctest counts as durably blocked, while one blocked
// reading a socket is not. With [Config.InMemory] the emulator opens no
// socket at all, so a test can run the SDK, the emulator and its broker in
// one bubble, on the bubble's fake clock.

// InMemoryHost is the host name in [Emulator.ConnectionString] of an
// emulator started with [Config.InMemory]. The SDK only uses it to name the
// namespace; connections go through [Emulator.NewWebSocketConn].
const InMemoryHost = "sbemu.in-memory"

// memListener is a net.Listener whose connections come from dial.
type memListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newMemListener() *memListener {
	return &memListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept returns the server end of the next dialled pipe.
func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close makes Accept and dial fail from now on.
func (l *memListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr names the in-memory endpoint.
func (l *memListener) Addr() net.Addr { return memAddr{} }

// dial creates a pipe and hands its server end to Accept.
func (l *memListener) dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-ctx.Done():
		_, _ = client.Close(), server.Close()
		return nil, ctx.Err()
	case <-l.done:
		_, _ = client.Close(), server.Close()
		return nil, net.ErrClosed
	}
}

// memAddr is the address of the in-memory endpoint.
type memAddr struct{}

func (memAddr) Network() string { return "memory" }
func (memAddr) String() string  { return InMemoryHost }

// DialInMemory opens a client connection to the emulator without a socket:
// the returned net.Conn is one end of a net.Pipe whose other end the
// emulator serves like an accepted TCP connection (limits, faults and
// Close included). It works whether or not the emulator also listens on
// TCP.
func (e *Emulator) DialInMemory(ctx context.Context) (net.Conn, error) {
	return e.mem.dial(ctx)
}

// NewWebSocketConn has the signature of azservicebus.ClientOptions'
// NewWebSocketConn, so the SDK can connect in memory:
//
//	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(),
//		&azservicebus.ClientOptions{NewWebSocketConn: em.NewWebSocketConn})
//
// It ignores args (the SDK's websocket URL) and calls [Emulator.DialInMemory].
func (e *Emulator) NewWebSocketConn(ctx context.Context, _ azservicebus.NewWebSocketConnArgs) (net.Conn, error) {
	return e.DialInMemory(ctx)
}
