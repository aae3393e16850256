package console

import (
	"context"
	"sync"
	"time"

	"github.com/sbretry/retry/internal/redact"
)

// EntityCounts is one entity's counts in a [Sample].
type EntityCounts struct {
	Active, Pending, DeadLetters int
	// Truncated says a read stopped at [Options.MaxPeek]: the counts are lower bounds.
	Truncated bool
	// Err is the redacted error of a read that failed; the counts are then zero.
	Err string
}

// Sample is one poll of every entity.
type Sample struct {
	At time.Time
	// Counts are by entity path, in the order the entities were given.
	Counts []EntityCounts
}

// ring keeps the latest samples, oldest first, up to its capacity. It is safe for concurrent use.
type ring struct {
	mu      sync.Mutex
	samples []Sample
	size    int
}

func newRing(size int) *ring { return &ring{size: max(size, 2)} }

func (r *ring) add(s Sample) {
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
func (r *ring) snapshot() []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Sample(nil), r.samples...)
}

// poll reads every entity once, concurrently, and returns the sample.
func (c *Console) poll(ctx context.Context) Sample {
	s := Sample{At: c.now(), Counts: make([]EntityCounts, len(c.entities))}
	var wg sync.WaitGroup
	for i, e := range c.entities {
		wg.Go(func() {
			n, err := e.in.Counts(ctx)
			if err != nil {
				s.Counts[i] = EntityCounts{Err: redact.String(err.Error())}
				return
			}
			s.Counts[i] = EntityCounts{Active: n.Active, Pending: n.Pending, DeadLetters: n.DeadLetters, Truncated: n.Truncated()}
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
		c.ring.add(c.poll(ctx))
		if c.polled != nil {
			c.polled()
		}
		t.Reset(c.opts.PollInterval)
	}
}

// Alert flags an entity on the overview.
type Alert struct {
	Entity string
	// Message says why, for people.
	Message string
}

// alerts are the dlqmonitor-style alerts of the latest sample: an entity whose dead letters reach the
// threshold, or grew since the sample before, or could not be read.
func (c *Console) alerts(samples []Sample) []Alert {
	if len(samples) == 0 {
		return nil
	}
	last := samples[len(samples)-1]
	var out []Alert
	for i, e := range c.entities {
		n := last.Counts[i]
		switch {
		case n.Err != "":
			out = append(out, Alert{Entity: e.cfg.Path, Message: "could not be read: " + n.Err})
			continue
		case len(samples) > 1 && n.DeadLetters > samples[len(samples)-2].Counts[i].DeadLetters:
			prev := samples[len(samples)-2].Counts[i].DeadLetters
			out = append(out, Alert{Entity: e.cfg.Path, Message: plural(n.DeadLetters-prev, "new dead letter") + " since the previous poll"})
		case n.DeadLetters >= c.opts.AlertThreshold:
			out = append(out, Alert{Entity: e.cfg.Path, Message: plural(n.DeadLetters, "dead letter") + " (threshold " + itoa(c.opts.AlertThreshold) + ")"})
		}
	}
	return out
}
