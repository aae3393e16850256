package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// consumerProcess runs the soak consumer as a child process, one at a time: start, SIGKILL, start
// again, and at the end a graceful SIGTERM. A child that exits by itself is an error the driver reports.
type consumerProcess struct {
	bin     string
	args    []string
	env     []string
	outDir  string
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the current child has been waited for
	waitErr error
	expect  bool // the current child's exit was asked for
	starts  int
	unasked []string // exits nobody asked for
}

// start starts a new child; its stdout and stderr go to consumer-<n>.log in outDir.
func (p *consumerProcess) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.starts++
	out, err := os.Create(filepath.Join(p.outDir, fmt.Sprintf("consumer-%02d.log", p.starts)))
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return err
	}
	exited := make(chan struct{})
	p.cmd, p.exited, p.expect = cmd, exited, false
	n := p.starts
	go func() {
		err := cmd.Wait()
		_ = out.Close()
		p.mu.Lock()
		p.waitErr = err
		if !p.expect {
			p.unasked = append(p.unasked, fmt.Sprintf("consumer #%d (pid %d) exited by itself: %v", n, cmd.Process.Pid, err))
		}
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// kill SIGKILLs the current child and waits for it.
func (p *consumerProcess) kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.expect = true
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop asks the current child to shut down (SIGTERM) and waits up to timeout; it returns the child's
// exit error, or an error saying it had to be killed.
func (p *consumerProcess) stop(timeout time.Duration) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.expect = true
	p.mu.Unlock()
	if cmd == nil {
		return errors.New("no consumer running")
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-exited:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.waitErr
	case <-t.C:
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		return fmt.Errorf("the consumer did not stop within %v of SIGTERM and was killed", timeout)
	}
}

// running reports whether the current child is alive.
func (p *consumerProcess) running() bool {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// unexpectedExits lists the exits nobody asked for.
func (p *consumerProcess) unexpectedExits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.unasked...)
}
