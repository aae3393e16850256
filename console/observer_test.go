package console

import (
	"context"
	"net/http"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
)

// countingObserver counts the calls it is told about, by operation and entity.
type countingObserver struct {
	mu    sync.Mutex
	calls map[[2]string]int // operation, entity
}

func (o *countingObserver) StartCall(ctx context.Context, c inspect.Call) (context.Context, func(inspect.CallResult)) {
	return ctx, func(inspect.CallResult) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.calls[[2]string{c.Operation, c.Entity}]++
	}
}

func (o *countingObserver) count(op, entity string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls[[2]string{op, entity}]
}

// Options.Observer is told about the broker calls of the pages and of the actions: a redrive run from
// the console reports its receive, sends and completes as the CLI's does.
func TestObserverSeesThePagesAndActionsCalls(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2")
	obs := &countingObserver{calls: map[[2]string]int{}}
	s := newSite(t, h, &Options{Observer: obs})
	const dlq = sbtest.Queue + "/$DeadLetterQueue"
	g := s.groups(t)[0]
	assert.Positive(t, obs.count(inspect.OpPeek, dlq), "the groups page peeks the dead-letter queue")

	form := url.Values{"action": {"redrive"}, "g": {g}}
	code, body, digest, refs := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, refs, 2)
	code, body = s.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Positive(t, obs.count(inspect.OpReceive, dlq))
	assert.Equal(t, 2, obs.count(inspect.OpSend, sbtest.Queue))
	assert.Equal(t, 2, obs.count(inspect.OpComplete, dlq))
}
