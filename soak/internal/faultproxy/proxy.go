// Package faultproxy is a TCP proxy that sits between a client and a server on loopback and breaks the
// connections through it on command, the way a network does: a clean close, a reset, a cut in the
// middle of a frame, and a stall (bytes held back, then delivered).
package faultproxy

import (
	"errors"
	"net"
	"sync"
	"time"
)

// DropMode is how [Proxy.Drop] ends the connections.
type DropMode int

const (
	// DropClose closes both sides with a FIN, as a server that shuts down cleanly would.
	DropClose DropMode = iota + 1
	// DropReset closes both sides with a RST (SO_LINGER 0), as a crashed middlebox would.
	DropReset
	// DropMidFrame lets through only part of the next chunk of bytes in either direction, then resets:
	// the peer is left holding half a frame. A connection with no traffic within cutWait is reset anyway.
	DropMidFrame
)

func (m DropMode) String() string {
	switch m {
	case DropClose:
		return "close"
	case DropReset:
		return "reset"
	case DropMidFrame:
		return "mid-frame"
	}
	return "unknown"
}

// cutWait bounds how long a mid-frame drop waits for a chunk to cut.
const cutWait = 500 * time.Millisecond

// Proxy forwards every connection accepted on its listener to a target address. Create it with
// [Start]; its methods are safe for concurrent use. Close stops it and waits for every goroutine it
// started.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	pairs   map[*pair]struct{}
	stallTo time.Time     // forwarding is held back until then
	resume  chan struct{} // closed when a stall ends early or the proxy closes; replaced per stall
	closed  bool

	wg sync.WaitGroup
}

// pair is one proxied connection: the client's side and the server's.
type pair struct {
	client, server *net.TCPConn
	once           sync.Once
	cut            chan struct{} // closed to ask the forwarding loops for a mid-frame cut
	cutOnce        sync.Once
}

// Start listens on a free loopback port and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, pairs: map[*pair]struct{}{}, resume: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Conns is the number of connections through the proxy now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pairs)
}

// Drop ends every connection through the proxy in mode and returns how many it ended. New connections
// are accepted as before.
func (p *Proxy) Drop(mode DropMode) int {
	p.mu.Lock()
	pairs := make([]*pair, 0, len(p.pairs))
	for pr := range p.pairs {
		pairs = append(pairs, pr)
	}
	p.mu.Unlock()
	for _, pr := range pairs {
		switch mode {
		case DropClose:
			pr.close(false)
		case DropReset:
			pr.close(true)
		case DropMidFrame:
			pr.cutOnce.Do(func() { close(pr.cut) })
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				t := time.NewTimer(cutWait)
				defer t.Stop()
				<-t.C
				pr.close(true) // no chunk came to cut, or the loops already closed it
			}()
		}
	}
	return len(pairs)
}

// Stall holds back every byte in both directions, on existing and new connections, for d; then the
// held bytes flow again. The connections stay open. A new Stall replaces a running one; Stall(0) ends it.
func (p *Proxy) Stall(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.resume)
	p.resume = make(chan struct{})
	p.stallTo = time.Now().Add(d)
}

// wait blocks while a stall is in effect.
func (p *Proxy) wait() {
	for {
		p.mu.Lock()
		until, resume, closed := p.stallTo, p.resume, p.closed
		p.mu.Unlock()
		d := time.Until(until)
		if d <= 0 || closed {
			return
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-resume:
		}
		t.Stop()
	}
}

// Close stops accepting, resets every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.resume)
	p.resume = make(chan struct{})
	p.mu.Unlock()
	err := p.ln.Close()
	p.Drop(DropReset)
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		pr := &pair{client: c.(*net.TCPConn), server: s.(*net.TCPConn), cut: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pr.close(true)
			return
		}
		p.pairs[pr] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.forward(pr, pr.client, pr.server)
		go p.forward(pr, pr.server, pr.client)
	}
}

// forward copies from src to dst until either side fails, honouring stalls and cuts.
func (p *Proxy) forward(pr *pair, src, dst *net.TCPConn) {
	defer p.wg.Done()
	defer func() {
		pr.close(false)
		p.mu.Lock()
		delete(p.pairs, pr)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			select {
			case <-pr.cut:
				// Let part of this chunk through, then reset: the reader gets half a frame.
				_, _ = dst.Write(buf[:max(n/2, 1)])
				pr.close(true)
				return
			default:
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a reset: the deferred close ends the other side the same way (AMQP never half-closes)
		}
	}
}

// close ends both sides once; reset sends RSTs instead of FINs.
func (pr *pair) close(reset bool) {
	pr.once.Do(func() {
		for _, c := range []*net.TCPConn{pr.client, pr.server} {
			if reset {
				_ = c.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}
