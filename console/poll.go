package console

import (
	"context"
	"sync"
	"time"

	"github.com/sbretry/retry/internal/redact"
)

// entityCounts is one entity's counts in a sample, as [inspect.Inspector.Counts] reads them.
type entityCounts struct {
	// Active counts messages receivable now or being processed, Pending the pending retries, and
	// DeadLetters the dead letters of every dead-letter queue of the entity.
	Active, Pending, DeadLetters int
	// Truncated says a read stopped at [Options.MaxPeek]: the counts are lower bounds.
	Truncated bool
	// Err is the redacted error of a read that failed; the counts are then zero.
	Err string
	// Sessions says the entity is a session entity: only its dead letters are counted (its active
	// messages and held retries are in its sessions).
	Sessions bool
}

// sample is one poll of every entity.
type sample struct {
	// At is when the poll started.
	At time.Time
	// Counts are one per entity, in the order the entities were given to [New].
	Counts []entityCounts
}

// ring keeps the latest samples, oldest first, up to its capacity: Window/PollInterval+1, so that the
// charts span the whole window and memory stays bounded whatever the uptime. It is safe for
// concurrent use: Run adds while pages read.
type ring struct {
	mu      sync.Mutex
	samples []sample
	size    int
}

// newRing returns an empty ring of size samples (at least two, so that an alert can compare).
func newRing(size int) *ring { return &ring{size: max(size, 2)} }

// add appends s, dropping the oldest sample when the ring is full.
func (r *ring) add(s sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, s)
	if len(r.samples) > r.size {
		// Copy down rather than reslice, so the backing array does not grow without bound.
		n := copy(r.samples, r.samples[len(r.samples)-r.size:])
		r.samples = r.samples[:n]
	}
}

// snapshot returns a copy of the samples, oldest first.
func (r *ring) snapshot() []sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sample(nil), r.samples...)
}

// poll reads every entity once, concurrently (one goroutine per entity, each with its own links), and
// returns the sample. An entity that cannot be read gets its redacted error instead of counts, so one
// missing entity does not blank the overview.
func (c *Console) poll(ctx context.Context) sample {
	s := sample{At: c.now(), Counts: make([]entityCounts, len(c.entities))}
	var wg sync.WaitGroup
	for i, e := range c.entities {
		wg.Go(func() {
			if e.session.Load() {
				s.Counts[i] = c.sessionCounts(ctx, e)
				return
			}
			n, err := e.in.Counts(ctx)
			if err != nil && c.recognise(ctx, e, err) {
				s.Counts[i] = c.sessionCounts(ctx, e)
				return
			}
			if err != nil && isSessionRefusal(err) {
				// Refused like a session entity, but it lists no sessions: most likely a topic.
				s.Counts[i] = entityCounts{Err: "it refused a plain receiver and lists no sessions: a topic is read through its subscriptions (TOPIC/Subscriptions/NAME)"}
				return
			}
			if err != nil {
				s.Counts[i] = entityCounts{Err: redact.String(err.Error())}
				return
			}
			s.Counts[i] = entityCounts{Active: n.Active, Pending: n.Pending, DeadLetters: n.DeadLetters, Truncated: n.Truncated()}
		})
	}
	wg.Wait()
	return s
}

// Run polls every entity every [Options.PollInterval] into the overview's history until ctx ends, then
// returns nil. Without Run the overview still shows current counts (it polls once when it has no
// sample yet), but no history. Run at most once at a time.
func (c *Console) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// A poll that ctx cut short still lands in the ring, with its errors: the overview shows that
		// the read failed rather than stale counts.
		c.ring.add(c.poll(ctx))
		if c.polled != nil {
			c.polled()
		}
		t.Reset(c.opts.PollInterval)
	}
}

// alert flags an entity on the overview, the way package dlqmonitor would report it.
type alert struct {
	// Entity is the path of the entity flagged.
	Entity string
	// Message says why, for people.
	Message string
}

// alerts are the dlqmonitor-style alerts of the latest sample: an entity whose dead letters reach the
// threshold, or grew since the sample before, or could not be read.
func (c *Console) alerts(samples []sample) []alert {
	if len(samples) == 0 {
		return nil
	}
	last := samples[len(samples)-1]
	var out []alert
	for i, e := range c.entities {
		n := last.Counts[i]
		switch {
		case n.Err != "":
			out = append(out, alert{Entity: e.cfg.Path, Message: "could not be read: " + n.Err})
			continue
		case len(samples) > 1 && n.DeadLetters > samples[len(samples)-2].Counts[i].DeadLetters:
			prev := samples[len(samples)-2].Counts[i].DeadLetters
			out = append(out, alert{Entity: e.cfg.Path, Message: plural(n.DeadLetters-prev, "new dead letter") + " since the previous poll"})
		case n.DeadLetters >= c.opts.AlertThreshold:
			out = append(out, alert{Entity: e.cfg.Path, Message: plural(n.DeadLetters, "dead letter") + " (threshold " + itoa(c.opts.AlertThreshold) + ")"})
		}
	}
	return out
}
