package main

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/soak/internal/ledger"
)

// monitor follows the run while it happens: it tails the consumer's ledger for progress, samples the
// queue for work waiting and for two live copies of one attempt, and measures the longest window
// without progress while no fault is in effect and work is waiting.
type monitor struct {
	tail  *ledger.Tail
	queue *broker.Queue
	start time.Time

	mu          sync.Mutex
	faults      int       // faults in effect now (a dead consumer counts as one)
	lastClear   time.Time // when the last fault ended (or the consumer started)
	lastFault   string    // the last fault begun, for the evidence of a stall
	lastProg    time.Time // the last settled delivery seen in the ledger
	lastIdle    time.Time // the last sample with no message waiting
	longest     time.Duration
	longestAt   time.Duration // offset into the run where the longest stall ended
	longestLast string        // the fault before it
	liveForks   []string
	tailErr     error
}

// newMonitor returns a monitor whose offsets count from start, as chaos.log's do.
func newMonitor(tail *ledger.Tail, q *broker.Queue, start time.Time) *monitor {
	now := time.Now()
	return &monitor{tail: tail, queue: q, start: start, lastClear: now, lastProg: now, lastIdle: now}
}

// begin marks a fault in effect; end marks it over.
func (m *monitor) begin(what string) {
	m.mu.Lock()
	m.faults++
	m.lastFault = what
	m.mu.Unlock()
}

func (m *monitor) end() {
	m.mu.Lock()
	m.faults--
	m.lastClear = time.Now()
	m.mu.Unlock()
}

// instant marks a fault that is over as soon as it happened (a drop, expired locks, rejections armed).
func (m *monitor) instant(what string) {
	m.begin(what)
	m.end()
}

// run samples every tick until stop is closed.
func (m *monitor) run(stop <-chan struct{}) {
	const tick = 50 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	forkCheck := time.Now()
	for {
		select {
		case <-stop:
			m.sample(true)
			return
		case <-t.C:
		}
		full := time.Since(forkCheck) >= 500*time.Millisecond
		if full {
			forkCheck = time.Now()
		}
		m.sample(full)
	}
}

// sample reads new ledger records and the queue once.
func (m *monitor) sample(checkForks bool) {
	l := m.tail.Log()
	successes, processed := len(l.Successes), len(l.Processed)
	_, err := m.tail.Read()
	progressed := len(l.Successes) > successes
	for _, p := range l.Processed[processed:] {
		progressed = progressed || p.Outcome != retry.OutcomeLeftForRedelivery.String()
	}
	waiting := m.queue.Stats().Active > 0
	now := time.Now()

	m.mu.Lock()
	if err != nil && m.tailErr == nil {
		m.tailErr = err
	}
	if progressed {
		m.lastProg = now
	}
	if !waiting {
		m.lastIdle = now
	}
	if m.faults == 0 && waiting {
		anchor := m.lastProg
		for _, t := range []time.Time{m.lastClear, m.lastIdle} {
			if t.After(anchor) {
				anchor = t
			}
		}
		if d := now.Sub(anchor); d > m.longest {
			m.longest, m.longestAt, m.longestLast = d, now.Sub(m.start), m.lastFault
		}
	}
	m.mu.Unlock()
	if checkForks {
		m.checkLiveCopies()
	}
}

// checkLiveCopies looks for two receivable or scheduled messages that are the same attempt of one chain.
func (m *monitor) checkLiveCopies() {
	type key struct {
		id      string
		attempt int64
	}
	seen := map[key]int{}
	add := func(props map[string]any, messageID any) {
		id, _ := props[envelope.PropOriginalMessageID].(string)
		if id == "" {
			id, _ = messageID.(string)
		}
		if strings.HasPrefix(id, "sbretry-probe-") {
			return
		}
		attempt, ok := props[envelope.PropAttempt].(int64)
		if !ok {
			attempt = 1
		}
		seen[key{id, attempt}]++
	}
	for _, msg := range m.queue.ActiveMessages() {
		var mid any
		if msg.Properties != nil {
			mid = msg.Properties.MessageID
		}
		add(msg.ApplicationProperties, mid)
	}
	for _, s := range m.queue.ScheduledMessages() {
		var mid any
		if s.Message.Properties != nil {
			mid = s.Message.Properties.MessageID
		}
		add(s.Message.ApplicationProperties, mid)
	}
	for k, n := range seen {
		if n > 1 {
			m.mu.Lock()
			if len(m.liveForks) < 20 {
				m.liveForks = append(m.liveForks, fmt.Sprintf("%s#%d(%d live copies at %v)", k.id, k.attempt, n, time.Since(m.start).Round(time.Millisecond)))
			}
			m.mu.Unlock()
		}
	}
}

// result is what the monitor saw.
func (m *monitor) result() (longest, at time.Duration, lastFault string, forks []string, tailErr error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.longest, m.longestAt, m.longestLast, append([]string(nil), m.liveForks...), m.tailErr
}
