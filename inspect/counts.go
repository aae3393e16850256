package inspect

import (
	"context"
)

// Counts is how many messages of each kind an entity holds, as one bounded read sees them.
type Counts struct {
	// Active counts the messages receivable now or being processed, in the entity and its retry queue.
	Active int
	// Pending counts the pending retries: scheduled retry copies (send-rights probes and other
	// producers' scheduled messages are not counted).
	Pending int
	// DeadLetters counts the messages in the dead-letter queues (see [Inspector.DeadLetterQueues]).
	DeadLetters int
	// Scans says what was read; a truncated scan makes its count a lower bound (see [Truncated]).
	Scans []Scan
}

// Truncated reports whether a scan stopped at [Options.MaxPeek], so that a count is a lower bound.
func (c *Counts) Truncated() bool { return Truncated(c.Scans) }

// Counts reads the entity, its retry queue when that is another queue, and the dead-letter queues, each
// up to [Options.MaxPeek] messages, and counts what it saw. It costs one scan of each, like
// [Inspector.Status]; dashboards that poll many entities should keep MaxPeek modest.
func (in *Inspector) Counts(ctx context.Context) (*Counts, error) {
	c := &Counts{}
	for _, s := range in.liveSources() {
		sc, err := in.scan(ctx, s, func(d decoded) {
			switch {
			case !d.isScheduled():
				c.Active++
			case d.isRetryCopy() && !d.isProbe():
				c.Pending++
			}
		})
		c.Scans = append(c.Scans, sc)
		if err != nil {
			return c, err
		}
	}
	for _, s := range in.deadSources() {
		sc, err := in.scan(ctx, s, func(decoded) { c.DeadLetters++ })
		c.Scans = append(c.Scans, sc)
		if err != nil {
			return c, err
		}
	}
	return c, nil
}
