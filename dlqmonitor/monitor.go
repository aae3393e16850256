package dlqmonitor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbretry/retry/internal/entitypath"
	"github.com/sbretry/retry/internal/redact"
)

// AdminClient is the part of *admin.Client the monitor calls: one runtime
// properties read per entity and poll. Tests pass a fake.
type AdminClient interface {
	GetQueueRuntimeProperties(ctx context.Context, queueName string, options *admin.GetQueueRuntimePropertiesOptions) (*admin.GetQueueRuntimePropertiesResponse, error)
	GetSubscriptionRuntimeProperties(ctx context.Context, topicName string, subscriptionName string, options *admin.GetSubscriptionRuntimePropertiesOptions) (*admin.GetSubscriptionRuntimePropertiesResponse, error)
}

var _ AdminClient = (*admin.Client)(nil)

// ErrAlreadyRunning is returned by [Monitor.Run] while another Run of the
// same monitor is active.
var ErrAlreadyRunning = errors.New("dlqmonitor: already running")

// entity is one configured path, parsed.
type entity struct {
	path string // as configured
	entitypath.Entity
}

// parseEntity accepts "queue" and "topic/Subscriptions/sub" (the segment in
// any case).
func parseEntity(path string) (entity, error) {
	e, err := entitypath.Parse(path)
	if err != nil {
		return entity{}, fmt.Errorf("dlqmonitor: %w", err)
	}
	return entity{path: path, Entity: e}, nil
}

// Monitor polls dead-letter counts; see the package documentation. Create
// it with [New] and start it with [Monitor.Run]. Its methods are safe for
// concurrent use; polls never overlap. The zero value is not usable.
type Monitor struct {
	client   AdminClient
	entities []entity
	opts     Options
	running  atomic.Bool

	// pollMu serialises polls and guards last.
	pollMu sync.Mutex
	last   []int64 // the count of the previous successful read, per entity

	health healthState // what Health reports (health.go)
}

// New returns a monitor of the given entities: queue names and
// subscriptions as "topic/Subscriptions/subscription". It checks the
// paths and options (an empty list, a malformed or repeated path or a
// negative option is an error) but calls nothing: a missing entity is
// reported to OnError on each poll, so a monitor started before its
// entities exist starts alerting once they do.
func New(client AdminClient, entities []string, opts *Options) (*Monitor, error) {
	if client == nil {
		return nil, errors.New("dlqmonitor: nil admin client")
	}
	if len(entities) == 0 {
		return nil, errors.New("dlqmonitor: no entities to monitor")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Monitor{client: client, opts: o, last: make([]int64, len(entities))}
	seen := map[string]bool{}
	for _, path := range entities {
		e, err := parseEntity(path)
		if err != nil {
			return nil, err
		}
		if key := strings.ToLower(path); seen[key] {
			return nil, fmt.Errorf("dlqmonitor: entity %q is listed twice", path)
		} else {
			seen[key] = true
		}
		m.entities = append(m.entities, e)
		m.health.h.Entities = append(m.health.h.Entities, EntityHealth{Entity: path})
	}
	return m, nil
}

// Run polls at once and then every Interval until ctx ends, and returns
// nil then. It runs the polls (and so the hooks) on the calling goroutine
// and starts no other, so when Run returns nothing of the monitor is left
// running. A second Run while one is active returns [ErrAlreadyRunning].
func (m *Monitor) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer m.running.Store(false)
	clock := m.opts.Clock
	for {
		if ctx.Err() != nil {
			return nil
		}
		start := clock.Now()
		m.Poll(ctx)
		wait := m.opts.Interval - clock.Now().Sub(start)
		if wait <= 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-clock.After(wait):
		}
	}
}

// Poll reads every entity's dead-letter count once, now, calls the hooks,
// records the outcome in [Monitor.Health] and returns the results in
// configuration order. Run calls it; call it
// yourself for a check on demand. Each read is bounded by Options.Timeout;
// when ctx ends Poll stops at once, reporting the entities it did not read
// with ctx's error and without calling OnError for them.
func (m *Monitor) Poll(ctx context.Context) []Result {
	m.pollMu.Lock()
	defer m.pollMu.Unlock()
	began := time.Now()
	results := make([]Result, len(m.entities))
	for i, e := range m.entities {
		results[i].Entity = e.path
		if err := ctx.Err(); err != nil {
			results[i].Err = err
			continue
		}
		count, err := m.read(ctx, e)
		now := m.opts.Clock.Now()
		if err != nil {
			results[i].Err = redact.Wrap(err)
			if ctx.Err() == nil && m.opts.OnError != nil {
				m.opts.OnError(ErrorParams{Entity: e.path, Err: results[i].Err, Time: now})
			}
			continue
		}
		fresh := max(0, count-m.last[i])
		m.last[i] = count
		results[i].Count, results[i].New = count, fresh
		if count >= m.opts.Threshold && m.opts.OnDeadLetters != nil {
			m.opts.OnDeadLetters(DeadLetterParams{Entity: e.path, Count: count, New: fresh, Time: now})
		}
	}
	// A poll cut short by ctx says nothing about the namespace.
	if ctx.Err() == nil {
		m.health.record(results, m.opts.Clock.Now())
	}
	if m.opts.OnPoll != nil {
		m.opts.OnPoll(PollParams{Results: results, Duration: time.Since(began)})
	}
	return results
}

// read returns one entity's DeadLetterMessageCount, bounded by Timeout.
func (m *Monitor) read(ctx context.Context, e entity) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	if e.IsSubscription() {
		resp, err := m.client.GetSubscriptionRuntimeProperties(ctx, e.Topic, e.Subscription, nil)
		switch {
		case err != nil:
			return 0, readError(e.path, err)
		case resp == nil:
			return 0, fmt.Errorf("%w: %s", ErrNotFound, e.path)
		}
		return int64(resp.DeadLetterMessageCount), nil
	}
	resp, err := m.client.GetQueueRuntimeProperties(ctx, e.path, nil)
	switch {
	case err != nil:
		return 0, readError(e.path, err)
	case resp == nil:
		return 0, fmt.Errorf("%w: %s", ErrNotFound, e.path)
	}
	return int64(resp.DeadLetterMessageCount), nil
}

// readError wraps a failed read so that it names the entity and, when the
// client's error carries it, the endpoint: "x509: certificate signed by
// unknown authority" alone does not say which namespace or emulator is
// meant.
func readError(path string, err error) error {
	if endpoint := endpointOf(err); endpoint != "" {
		return fmt.Errorf("dlqmonitor: reading %s at %s: %w", path, endpoint, err)
	}
	return fmt.Errorf("dlqmonitor: reading %s: %w", path, err)
}
