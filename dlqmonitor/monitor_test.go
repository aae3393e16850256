package dlqmonitor_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/dlqmonitor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeAdmin serves dead-letter counts from a map; a missing entity reads
// as not found (a nil response, as the SDK gives for a 404).
type fakeAdmin struct {
	mu     sync.Mutex
	counts map[string]int32
	err    error
	block  bool // wait for the context instead of answering
	calls  []string
}

func (f *fakeAdmin) set(entity string, n int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts[entity] = n
}

func (f *fakeAdmin) lookup(ctx context.Context, path string) (int32, bool, error) {
	f.mu.Lock()
	f.calls = append(f.calls, path)
	n, ok := f.counts[path]
	err, block := f.err, f.block
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return 0, false, ctx.Err()
	}
	return n, ok, err
}

func (f *fakeAdmin) GetQueueRuntimeProperties(ctx context.Context, name string, _ *admin.GetQueueRuntimePropertiesOptions) (*admin.GetQueueRuntimePropertiesResponse, error) {
	n, ok, err := f.lookup(ctx, name)
	if err != nil || !ok {
		return nil, err
	}
	return &admin.GetQueueRuntimePropertiesResponse{QueueName: name, QueueRuntimeProperties: admin.QueueRuntimeProperties{DeadLetterMessageCount: n}}, nil
}

func (f *fakeAdmin) GetSubscriptionRuntimeProperties(ctx context.Context, topic, sub string, _ *admin.GetSubscriptionRuntimePropertiesOptions) (*admin.GetSubscriptionRuntimePropertiesResponse, error) {
	n, ok, err := f.lookup(ctx, topic+"/Subscriptions/"+sub)
	if err != nil || !ok {
		return nil, err
	}
	return &admin.GetSubscriptionRuntimePropertiesResponse{SubscriptionRuntimeProperties: admin.SubscriptionRuntimeProperties{DeadLetterMessageCount: n}}, nil
}

// stepClock is a fake clock whose After hands its channel to the test, so
// the test knows the monitor is waiting before it moves time on.
type stepClock struct {
	mu    sync.Mutex
	now   time.Time
	waits chan wait
}

type wait struct {
	d  time.Duration
	ch chan time.Time
}

func newStepClock() *stepClock {
	return &stepClock{now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), waits: make(chan wait, 16)}
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) After(d time.Duration) <-chan time.Time {
	w := wait{d: d, ch: make(chan time.Time, 1)}
	c.waits <- w
	return w.ch
}

// next waits (bounded) for the monitor to sleep, then ends the sleep.
func (c *stepClock) next(t *testing.T) time.Duration {
	t.Helper()
	select {
	case w := <-c.waits:
		c.mu.Lock()
		c.now = c.now.Add(w.d)
		now := c.now
		c.mu.Unlock()
		w.ch <- now
		return w.d
	case <-time.After(10 * time.Second):
		t.Fatal("the monitor never waited for its next poll")
		return 0
	}
}

// recorder collects hook calls.
type recorder struct {
	mu     sync.Mutex
	alerts []dlqmonitor.DeadLetterParams
	errs   []dlqmonitor.ErrorParams
}

func (r *recorder) options(o dlqmonitor.Options) *dlqmonitor.Options {
	o.OnDeadLetters = func(p dlqmonitor.DeadLetterParams) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.alerts = append(r.alerts, p)
	}
	o.OnError = func(p dlqmonitor.ErrorParams) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.errs = append(r.errs, p)
	}
	return &o
}

// take returns and forgets the calls so far.
func (r *recorder) take() ([]dlqmonitor.DeadLetterParams, []dlqmonitor.ErrorParams) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, e := r.alerts, r.errs
	r.alerts, r.errs = nil, nil
	return a, e
}

func TestPollReportsCountAndNewSinceLastPoll(t *testing.T) {
	fake := &fakeAdmin{counts: map[string]int32{"orders": 1, "events/Subscriptions/billing": 0}}
	clock := newStepClock()
	var rec recorder
	m, err := dlqmonitor.New(fake, []string{"orders", "events/Subscriptions/billing"}, rec.options(dlqmonitor.Options{Clock: clock}))
	require.NoError(t, err)
	ctx := context.Background()

	steps := []struct {
		name   string
		counts map[string]int32
		want   []dlqmonitor.DeadLetterParams
	}{
		{"first dead letter", nil, []dlqmonitor.DeadLetterParams{{Entity: "orders", Count: 1, New: 1}}},
		{"one more", map[string]int32{"orders": 2}, []dlqmonitor.DeadLetterParams{{Entity: "orders", Count: 2, New: 1}}},
		{"nothing new still alerts", nil, []dlqmonitor.DeadLetterParams{{Entity: "orders", Count: 2, New: 0}}},
		{"purged, below threshold", map[string]int32{"orders": 0}, nil},
		{"subscription", map[string]int32{"events/Subscriptions/billing": 3}, []dlqmonitor.DeadLetterParams{{Entity: "events/Subscriptions/billing", Count: 3, New: 3}}},
	}
	for _, step := range steps {
		for e, n := range step.counts {
			fake.set(e, n)
		}
		results := m.Poll(ctx)
		require.Len(t, results, 2, step.name)
		alerts, errs := rec.take()
		assert.Empty(t, errs, step.name)
		for i := range alerts {
			assert.Equal(t, clock.Now(), alerts[i].Time, step.name)
			alerts[i].Time = time.Time{}
		}
		assert.Equal(t, step.want, alerts, step.name)
	}
}

func TestThreshold(t *testing.T) {
	fake := &fakeAdmin{counts: map[string]int32{"orders": 4}}
	var rec recorder
	m, err := dlqmonitor.New(fake, []string{"orders"}, rec.options(dlqmonitor.Options{Threshold: 5}))
	require.NoError(t, err)
	res := m.Poll(context.Background())
	assert.Equal(t, []dlqmonitor.Result{{Entity: "orders", Count: 4, New: 4}}, res)
	alerts, _ := rec.take()
	assert.Empty(t, alerts)

	fake.set("orders", 5)
	m.Poll(context.Background())
	alerts, _ = rec.take()
	require.Len(t, alerts, 1)
	assert.EqualValues(t, 5, alerts[0].Count)
	assert.EqualValues(t, 1, alerts[0].New, "new counts from the last read, not the last alert")
}

func TestErrorsAreRedactedAndKeepTheLastCount(t *testing.T) {
	secret := errors.New("dial failed for Endpoint=sb://x/;SharedAccessKeyName=root;SharedAccessKey=hunter2")
	fake := &fakeAdmin{counts: map[string]int32{"orders": 1}}
	var rec recorder
	m, err := dlqmonitor.New(fake, []string{"orders", "missing"}, rec.options(dlqmonitor.Options{}))
	require.NoError(t, err)
	ctx := context.Background()

	m.Poll(ctx)
	_, errs := rec.take()
	require.Len(t, errs, 1)
	assert.Equal(t, "missing", errs[0].Entity)
	assert.ErrorIs(t, errs[0].Err, dlqmonitor.ErrNotFound)

	fake.mu.Lock()
	fake.err = secret
	fake.mu.Unlock()
	fake.set("orders", 3)
	res := m.Poll(ctx)
	alerts, errs := rec.take()
	assert.Empty(t, alerts)
	require.Len(t, errs, 2)
	assert.ErrorIs(t, errs[0].Err, secret, "the redacted error still matches")
	assert.NotContains(t, errs[0].Err.Error(), "hunter2")
	assert.Contains(t, errs[0].Err.Error(), "SharedAccessKey=REDACTED")
	assert.NotContains(t, res[0].Err.Error(), "hunter2")

	fake.mu.Lock()
	fake.err = nil
	fake.mu.Unlock()
	m.Poll(ctx)
	alerts, _ = rec.take()
	require.Len(t, alerts, 1)
	assert.EqualValues(t, 2, alerts[0].New, "what arrived during the outage is new")
}

func TestEveryReadIsBounded(t *testing.T) {
	fake := &fakeAdmin{counts: map[string]int32{}, block: true}
	var rec recorder
	m, err := dlqmonitor.New(fake, []string{"slow"}, rec.options(dlqmonitor.Options{Timeout: 20 * time.Millisecond}))
	require.NoError(t, err)
	res := m.Poll(context.Background())
	assert.ErrorIs(t, res[0].Err, context.DeadlineExceeded)
	_, errs := rec.take()
	require.Len(t, errs, 1)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res = m.Poll(ctx)
	assert.ErrorIs(t, res[0].Err, context.Canceled)
	_, errs = rec.take()
	assert.Empty(t, errs, "a poll cut short by its caller is not a failure of the entity")
}

func TestRunPollsEveryIntervalUntilCancelled(t *testing.T) {
	fake := &fakeAdmin{counts: map[string]int32{"orders": 0}}
	clock := newStepClock()
	polls := make(chan dlqmonitor.PollParams, 8)
	m, err := dlqmonitor.New(fake, []string{"orders"}, &dlqmonitor.Options{
		Clock: clock, Interval: 5 * time.Minute,
		OnPoll: func(p dlqmonitor.PollParams) { polls <- p },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	recvPoll := func() dlqmonitor.PollParams {
		select {
		case p := <-polls:
			return p
		case <-time.After(10 * time.Second):
			t.Fatal("no poll")
			return dlqmonitor.PollParams{}
		}
	}
	recvPoll()            // at once
	fake.set("orders", 1) // before the wait ends, or the poll may miss it
	assert.Equal(t, 5*time.Minute, clock.next(t))
	p := recvPoll()
	assert.EqualValues(t, 1, p.Results[0].New)
	assert.ErrorIs(t, m.Run(ctx), dlqmonitor.ErrAlreadyRunning)

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestNewValidates(t *testing.T) {
	fake := &fakeAdmin{}
	tests := []struct {
		name     string
		entities []string
		opts     *dlqmonitor.Options
	}{
		{"no entities", nil, nil},
		{"empty name", []string{""}, nil},
		{"two segments", []string{"events/billing"}, nil},
		{"wrong segment", []string{"events/Subs/billing"}, nil},
		{"dead-letter path", []string{"orders/$DeadLetterQueue"}, nil},
		{"repeated", []string{"orders", "ORDERS"}, nil},
		{"negative interval", []string{"orders"}, &dlqmonitor.Options{Interval: -1}},
		{"negative threshold", []string{"orders"}, &dlqmonitor.Options{Threshold: -1}},
		{"negative timeout", []string{"orders"}, &dlqmonitor.Options{Timeout: -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dlqmonitor.New(fake, tc.entities, tc.opts)
			assert.Error(t, err)
		})
	}
	_, err := dlqmonitor.New(nil, []string{"orders"}, nil)
	assert.Error(t, err)
	_, err = dlqmonitor.New(fake, []string{"orders", "events/subscriptions/billing"}, nil)
	assert.NoError(t, err)
}
