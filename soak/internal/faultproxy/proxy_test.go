package faultproxy

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers every connection by echoing what it reads, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// dial connects through p and proves the connection forwards.
func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf))
	require.Eventually(t, func() bool { return p.Conns() == 1 }, time.Second, time.Millisecond)
	return c
}

func TestDrop(t *testing.T) {
	cases := []struct {
		name string
		mode DropMode
		want func(t *testing.T, got []byte, err error)
	}{
		{name: "close gives EOF", mode: DropClose, want: func(t *testing.T, got []byte, err error) {
			assert.Empty(t, got)
			assert.ErrorIs(t, err, io.EOF)
		}},
		{name: "reset gives ECONNRESET", mode: DropReset, want: func(t *testing.T, got []byte, err error) {
			assert.Empty(t, got)
			assert.ErrorIs(t, err, syscall.ECONNRESET)
		}},
		{name: "mid-frame cut of an idle connection resets it", mode: DropMidFrame, want: func(t *testing.T, got []byte, err error) {
			assert.Empty(t, got)
			assert.ErrorIs(t, err, syscall.ECONNRESET)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Start(echoServer(t))
			require.NoError(t, err)
			defer func() { assert.NoError(t, p.Close()) }()
			c := dial(t, p)
			assert.Equal(t, 1, p.Drop(tc.mode))
			require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
			got, err := readToEnd(c)
			tc.want(t, got, err)
		})
	}
}

func TestStallHoldsBytesThenDeliversThem(t *testing.T) {
	p, err := Start(echoServer(t))
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()
	c := dial(t, p)
	p.Stall(300 * time.Millisecond)
	start := time.Now()
	_, err = c.Write([]byte("held"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "held", string(buf))
	assert.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, "the bytes waited for the stall")
	assert.Equal(t, 1, p.Conns(), "a stall keeps the connection")
}

func TestStallZeroEndsAStall(t *testing.T) {
	p, err := Start(echoServer(t))
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()
	c := dial(t, p)
	p.Stall(time.Hour)
	_, err = c.Write([]byte("held"))
	require.NoError(t, err)
	// While stalled nothing comes back: a short read times out.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	var one [1]byte
	_, err = c.Read(one[:])
	var nerr net.Error
	require.ErrorAs(t, err, &nerr)
	require.True(t, nerr.Timeout(), "held while stalled")
	p.Stall(0)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
}

func TestCloseEndsAStallAndEveryConnection(t *testing.T) {
	p, err := Start(echoServer(t))
	require.NoError(t, err)
	c := dial(t, p)
	p.Stall(time.Hour)
	_, _ = c.Write([]byte("held"))
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for the stall")
	}
	assert.NoError(t, p.Close(), "Close is idempotent")
}

// readToEnd reads until an error and returns what it read with that error (io.EOF included).
func readToEnd(c net.Conn) ([]byte, error) {
	var got []byte
	buf := make([]byte, 64)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got, err
		}
	}
}

func TestMidFrameCutDeliversPartOfAChunk(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	received := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		got, _ := readToEnd(c)
		received <- got
	}()
	p, err := Start(ln.Addr().String())
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	require.Eventually(t, func() bool { return p.Conns() == 1 }, time.Second, time.Millisecond)
	p.Drop(DropMidFrame)
	_, err = c.Write([]byte("12345678"))
	require.NoError(t, err)
	select {
	case got := <-received:
		assert.Equal(t, "1234", string(got), "half of the chunk, then the cut")
	case <-time.After(5 * time.Second):
		t.Fatal("the server saw no end of the connection")
	}
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = readToEnd(c)
	assert.ErrorIs(t, err, syscall.ECONNRESET)
}
