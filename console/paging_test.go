package console

import (
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

var nextPattern = regexp.MustCompile(`id="next-page" href="([^"]+)"`)

// TestPendingAndGroupPagesArePaged: with a page size of one, the pending list and a group's list show
// one row and link the next page, which shows the other row and no further link.
func TestPendingAndGroupPagesArePaged(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "pending-1", "pending-2", "perm-1", "perm-2")
	s := newSite(t, h, &Options{PageSize: 1})
	rows := func(body string) []string {
		var out []string
		for _, m := range refValue.FindAllStringSubmatch(body, -1) {
			out = append(out, unescape(m[1]))
		}
		return out
	}
	for _, start := range []string{"/pending?e=orders", "/group?e=orders&g=" + s.groups(t)[0]} {
		code, body := s.get(t, start)
		require.Equal(t, http.StatusOK, code, body)
		first := rows(body)
		require.Len(t, first, 1, start)
		next := nextPattern.FindStringSubmatch(body)
		require.NotNil(t, next, start)
		code, body = s.get(t, "/"+unescape(next[1]))
		require.Equal(t, http.StatusOK, code, body)
		second := rows(body)
		require.Len(t, second, 1, start)
		assert.NotEqual(t, first, second, start)
		assert.NotRegexp(t, `id="next-page"`, body, "the last page links no further")
	}
}

// TestOverviewShowsAnEntityItCannotRead: an entity that cannot be read shows its error and an alert;
// the others are shown as usual.
func TestOverviewShowsAnEntityItCannotRead(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	c, err := New(h.Client, []Entity{{Path: "orders"}, {Path: "missing-queue"}}, nil)
	require.NoError(t, err)
	s := serve(t, h, c)
	code, body := s.get(t, "/")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-entity="orders"`)
	assert.Regexp(t, `missing-queue</a>: could not be read: `, body)
}

// TestActionStoppedPartWay: a dead letter locked by another receiver is not received within the wait;
// the result page says how far the purge got and that running it again finishes it.
func TestActionStoppedPartWay(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2")
	s := newSite(t, h, &Options{ReceiveWait: 300 * time.Millisecond})
	form := url.Values{"action": {"purge"}, "g": {s.groups(t)[0]}}
	code, body, digest, _ := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)

	ctx := sbtest.Context(t)
	other, err := h.Client.NewReceiverForQueue(sbtest.Queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	require.NoError(t, err)
	defer func() { _ = other.Close(ctx) }()
	locked, err := other.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, locked, 1)

	form.Set("confirm", "yes")
	code, body = s.run(t, form, digest)
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Contains(t, body, "Deleted 1 of 2")
	assert.Contains(t, body, "purge stopped after 1 of 2")
	assert.Contains(t, body, "probably locked by another receiver")
	assert.Contains(t, body, "running the same action again finishes it")
	require.NoError(t, other.AbandonMessage(ctx, locked[0], nil))
	assert.Equal(t, 1, h.Stats(t).DeadLettered, "the locked one is still there")
}

// TestBadActionForms: every malformed action form is refused with a 4xx that says why, and nothing is
// read or changed.
func TestBadActionForms(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	s := newSite(t, h, nil)
	tok := s.token(t, "/")
	for _, tc := range []struct {
		name string
		form url.Values
		code int
		want string
	}{
		{"unknown entity", url.Values{"e": {"nope"}, "action": {"purge"}, "g": {"x"}}, http.StatusNotFound, "unknown entity"},
		{"unknown action", url.Values{"e": {"orders"}, "action": {"delete"}, "g": {"x"}}, http.StatusBadRequest, "unknown action"},
		{"malformed ref", url.Values{"e": {"orders"}, "action": {"purge"}, "ref": {"seventeen"}}, http.StatusBadRequest, "malformed reference"},
		{"bare ref", url.Values{"e": {"orders"}, "action": {"purge"}, "ref": {"1"}}, http.StatusBadRequest, "has no entity"},
		{"ref of another entity", url.Values{"e": {"orders"}, "action": {"purge"}, "ref": {"other/$DeadLetterQueue:1"}}, http.StatusBadRequest, "other/$DeadLetterQueue:1"},
		{"group and refs", url.Values{"e": {"orders"}, "action": {"purge"}, "g": {"x"}, "ref": {"orders/$DeadLetterQueue:1"}}, http.StatusBadRequest, "not both"},
		{"nothing", url.Values{"e": {"orders"}, "action": {"purge"}}, http.StatusBadRequest, "nothing selected"},
		{"unknown group", url.Values{"e": {"orders"}, "action": {"redrive"}, "g": {"000000000000"}}, http.StatusConflict, "no failure group"},
		{"cancel of a group", url.Values{"e": {"orders"}, "action": {"cancel"}, "g": {"x"}}, http.StatusBadRequest, "not a failure group"},
		{"cancel of a dead letter", url.Values{"e": {"orders"}, "action": {"cancel"}, "ref": {"orders/$DeadLetterQueue:1"}}, http.StatusBadRequest, "orders/$DeadLetterQueue:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.form.Set("csrf", tok)
			code, body := s.post(t, "/action/preview", tc.form)
			assert.Equal(t, tc.code, code, body)
			assert.Contains(t, unescape(body), tc.want)
		})
	}
	assert.Equal(t, 1, h.Stats(t).DeadLettered)
}

// TestPreviewSaysWhenAGroupWasReadInPart: with the peek bound below the dead letters' count, a group is
// what was read, and the preview says so.
func TestPreviewSaysWhenAGroupWasReadInPart(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2")
	s := newSite(t, h, &Options{MaxPeek: 1})
	code, body, _, refs := s.preview(t, url.Values{"action": {"purge"}, "g": {s.groups(t)[0]}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Len(t, refs, 1)
	assert.Contains(t, body, `id="truncated"`)
}
