package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/soak/internal/faultproxy"
)

// chaos injects faults on a schedule drawn from the seed: one fault at a time, each followed by a
// quiet period (sometimes longer than the stall bound, so that the bound is tested), until the chaos
// phase ends. Kills run on their own schedule (see killer), so a kill can land in the middle of a fault.
type chaos struct {
	em    *sbemu.Emulator
	proxy *faultproxy.Proxy
	mon   *monitor
	log   *os.File
	start time.Time
	// exclude names fault kinds left out of the deck, and "reject-settlements-retryable" for the
	// settlement rejections the SDK retries (server-busy, internal-error), leaving only lock-lost ones.
	exclude map[string]bool

	mu     sync.Mutex
	counts map[string]int
	drops  int
}

// excludeRetryableSettle, in -exclude, keeps settlement rejections to the lock-lost condition.
const excludeRetryableSettle = "reject-settlements-retryable"

// fault is one kind of fault: its name and what it does (durational faults sleep inside until they end).
type fault struct {
	name string
	do   func(r *rand.Rand)
}

func (c *chaos) faults() []fault {
	dur := func(r *rand.Rand, lo, hi time.Duration) time.Duration {
		return lo + time.Duration(r.Int64N(int64(hi-lo)))
	}
	held := func(name string, d time.Duration, on, off func()) {
		c.note("%s for %v", name, d.Round(time.Millisecond))
		c.mon.begin(name)
		on()
		time.Sleep(d)
		off()
		c.mon.end()
	}
	drop := func(mode faultproxy.DropMode) func(*rand.Rand) {
		return func(*rand.Rand) {
			n := c.proxy.Drop(mode)
			c.addDrop()
			c.note("proxy drop (%v) of %d connections", mode, n)
			c.mon.instant("proxy drop " + mode.String())
		}
	}
	return []fault{
		{"proxy-close", drop(faultproxy.DropClose)},
		{"proxy-reset", drop(faultproxy.DropReset)},
		{"proxy-mid-frame", drop(faultproxy.DropMidFrame)},
		{"proxy-stall", func(r *rand.Rand) {
			d := dur(r, 300*time.Millisecond, 3*time.Second)
			held("proxy stall", d, func() { c.proxy.Stall(d) }, func() { c.proxy.Stall(0) })
		}},
		{"emulator-hang", func(r *rand.Rand) {
			d := dur(r, 300*time.Millisecond, 3*time.Second)
			held("emulator hang", d, func() { c.em.Hang(d) }, func() { c.em.Hang(0) })
		}},
		{"emulator-drop", func(*rand.Rand) {
			c.em.DropConnections()
			c.addDrop()
			c.note("emulator drops every connection")
			c.mon.instant("emulator drop")
		}},
		{"outage", func(r *rand.Rand) {
			d := dur(r, 500*time.Millisecond, 3*time.Second)
			held("outage (drop and refuse connections)", d, func() {
				c.em.RefuseConnections(d)
				c.em.DropConnections()
				c.addDrop()
			}, func() { c.em.RefuseConnections(0) })
		}},
		{"expire-locks", func(*rand.Rand) {
			c.em.ExpireLocks()
			c.note("every lock expired")
			c.mon.instant("expire locks")
		}},
		{"reject-sends", func(r *rand.Rand) {
			n := 1 + r.IntN(5)
			c.em.RejectNextSends(n, "com.microsoft:server-busy")
			c.note("next %d sends rejected", n)
			c.mon.instant("reject sends")
		}},
		{"reject-schedules", func(r *rand.Rand) {
			n := 1 + r.IntN(8)
			c.em.RejectNextManagement(n, "com.microsoft:schedule-message", 503)
			c.note("next %d schedule requests (republishes) rejected with 503", n)
			c.mon.instant("reject schedules")
		}},
		{"reject-settlements", func(r *rand.Rand) {
			n := 1 + r.IntN(8)
			conds := []string{"com.microsoft:server-busy", "com.microsoft:message-lock-lost", "amqp:internal-error"}
			if c.exclude[excludeRetryableSettle] {
				conds = []string{"com.microsoft:message-lock-lost"}
			}
			cond := conds[r.IntN(len(conds))]
			c.em.RejectNextSettlements(n, cond)
			c.note("next %d settlements rejected with %s", n, cond)
			c.mon.instant("reject settlements")
		}},
	}
}

// run injects faults until deadline. Faults are dealt from a shuffled deck holding every kind once
// (reshuffled when it runs out), so that even a short run meets each kind.
func (c *chaos) run(r *rand.Rand, deadline time.Time) {
	var fs []fault
	for _, f := range c.faults() {
		if !c.exclude[f.name] {
			fs = append(fs, f)
		}
	}
	if len(fs) == 0 {
		return
	}
	var deck []fault
	for {
		quiet := time.Duration(200+r.IntN(2300)) * time.Millisecond
		if r.IntN(100) < 10 {
			quiet = time.Duration(5500+r.IntN(1500)) * time.Millisecond // longer than the stall bound
		}
		if time.Now().Add(quiet).After(deadline) {
			return
		}
		time.Sleep(quiet)
		if len(deck) == 0 {
			deck = append(deck, fs...)
			r.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		f := deck[0]
		deck = deck[1:]
		c.count(f.name)
		f.do(r)
	}
}

// clear ends every fault that may still be armed.
func (c *chaos) clear() {
	c.proxy.Stall(0)
	c.em.Hang(0)
	c.em.RefuseConnections(0)
	c.em.RejectNextSends(0, "")
	c.em.RejectNextManagement(0, "", 0)
	c.em.RejectNextSettlements(0, "")
}

// killer SIGKILLs the consumer at random intervals in [lo, hi) until deadline, restarting it after a
// random pause of up to restartMax.
func (c *chaos) killer(r *rand.Rand, p *consumerProcess, lo, hi, restartMax time.Duration, deadline time.Time) error {
	for {
		wait := lo + time.Duration(r.Int64N(int64(hi-lo)))
		if time.Now().Add(wait).After(deadline) {
			return nil
		}
		time.Sleep(wait)
		pause := time.Duration(r.Int64N(int64(restartMax)))
		c.mon.begin("consumer killed")
		p.kill()
		c.count("kill")
		c.note("consumer SIGKILLed; restarting in %v", pause.Round(time.Millisecond))
		time.Sleep(pause)
		if err := p.start(); err != nil {
			c.mon.end()
			return err
		}
		c.mon.end()
	}
}

func (c *chaos) count(name string) {
	c.mu.Lock()
	c.counts[name]++
	c.mu.Unlock()
}

func (c *chaos) addDrop() {
	c.mu.Lock()
	c.drops++
	c.mu.Unlock()
}

// note writes one line to chaos.log with the offset into the run and the wall-clock time (UTC).
func (c *chaos) note(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	fmt.Fprintf(c.log, "%8.3fs  %s  %s\n", now.Sub(c.start).Seconds(), now.UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// summary returns the fault counts.
func (c *chaos) summary() (counts map[string]int, drops int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out, c.drops
}
