package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
	"github.com/sbretry/retry/sessionstate"
)

// Session entities. A queue or subscription that requires sessions refuses the plain receiver every
// peek of the entity needs (Service Bus answers amqp:not-allowed), so its active messages cannot be
// counted and it has no pending retries to list: a retry.SessionConsumer holds its retries in the
// sessions themselves. The console recognises such an entity, from Entity.SessionConsumer or from that
// refusal, and shows it for what it is: its dead letters (its dead-letter queue reads as usual) and
// its held sessions, never the raw refusal.

// inspector is the entity's inspector: the session one once the entity is recognised as a session
// entity, else the plain one.
func (e *entity) inspector() *inspect.Inspector {
	if e.session.Load() {
		return e.sessionIn
	}
	return e.in
}

// isSessionRefusal reports the refusal a session entity gives a plain receiver: Service Bus's
// amqp:not-allowed (which the SDK passes through as a go-amqp error), or inspect's ErrSessionEntity.
// A topic's name given where a queue is expected is refused with the same condition: recognise checks
// which it is.
func isSessionRefusal(err error) bool {
	var ae *amqp.Error
	return errors.Is(err, inspect.ErrSessionEntity) || (errors.As(err, &ae) && ae.Condition == amqp.ErrCondNotAllowed)
}

// recognise reports whether err, from reading e, says e is a session entity, and marks it so. The
// refusal alone cannot tell a session entity from a topic (both refuse a plain receiver), so the
// sessions of the entity are listed once: only a session entity has any to list.
func (c *Console) recognise(ctx context.Context, e *entity, err error) bool {
	if e.session.Load() {
		return true
	}
	if !isSessionRefusal(err) {
		return false
	}
	var pager interface {
		NextPage(ctx context.Context) (azservicebus.ListSessionsResponse, error)
	}
	if e.parsed.IsSubscription() {
		pager = c.client.NewListSessionsForSubscriptionPager(e.parsed.Topic, e.parsed.Subscription, nil)
	} else {
		pager = c.client.NewListSessionsForQueuePager(e.parsed.Queue, nil)
	}
	if _, lerr := pager.NextPage(ctx); lerr != nil {
		return false
	}
	e.session.Store(true)
	return true
}

// sessionCounts counts a session entity's dead letters, the one count it has without reading every
// session.
func (c *Console) sessionCounts(ctx context.Context, e *entity) entityCounts {
	sel, err := dlqaction.Select(ctx, e.sessionIn, inspect.DeadLetterFilter{})
	if err != nil {
		return entityCounts{Sessions: true, Err: shownText(err.Error())}
	}
	return entityCounts{Sessions: true, DeadLetters: len(sel.Items), Truncated: inspect.Truncated(sel.Scans)}
}

// heldRow is one held session as the sessions page shows it.
type heldRow struct {
	inspect.HeldSession
	// Status is held, dead-lettered, followers, locked, foreign or unreadable.
	Status string
	// Reason is the dead-letter reason, else the last error, else what kept it from being read.
	Reason string
	// Wake is the next wake-up, nil without one.
	Wake *inspect.WakeUp
	// Releasable says the release button is shown: a session whose state is a hold record that was
	// read, of a queue or of a subscription with Entity.WakeTo.
	Releasable bool
}

// Statuses of a held session.
const (
	sessionHeld         = "held"          // a retry waits for its wake-up
	sessionDeadLettered = "dead-lettered" // blocked after its message was dead-lettered
	sessionFollowers    = "followers"     // followers deferred, no held message
	sessionLocked       = "locked"        // a consumer held its lock: not read
	sessionForeign      = "foreign state" // its state is not a hold record: left alone
	sessionUnreadable   = "unreadable"
)

// rowOf describes s for the sessions page; releasable says the entity's sessions can be released.
func rowOf(s inspect.HeldSession, releasable bool) heldRow {
	row := heldRow{HeldSession: s, Wake: s.NextWakeUp()}
	h := s.Hold()
	switch {
	case s.Locked:
		row.Status, row.Reason = sessionLocked, "a consumer holds the session now: it is read when it lets go"
	case s.ReadErr != nil:
		row.Status, row.Reason = sessionUnreadable, s.ReadErr.Error()
	case s.StateErr != nil:
		row.Status, row.Reason = sessionForeign, s.StateErr.Error()
	case h == nil:
		row.Status = sessionFollowers
	case h.DeadLetterReason != "":
		row.Status, row.Reason = sessionDeadLettered, h.DeadLetterReason
	default:
		row.Status, row.Reason = sessionHeld, h.LastError
	}
	row.Releasable = releasable && !s.Locked && s.ReadErr == nil && s.StateErr == nil
	return row
}

// sessionsPage lists the held sessions of a session entity: what blocks each, its followers and its
// next wake-up, with a release for each (operators, queues).
func (c *Console) sessionsPage(w http.ResponseWriter, r *http.Request) {
	e, ok := c.entityOf(w, r)
	if !ok {
		return
	}
	ctx, cancel := readContext(r)
	defer cancel()
	held, err := e.sessionIn.ListHeldSessions(ctx)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, "listing the held sessions of %s: %s", e.cfg.Path, describeReadError(err))
		return
	}
	e.session.Store(true) // the listing worked: it is a session entity
	releasable := !e.parsed.IsSubscription() || e.cfg.WakeTo != ""
	rows := make([]heldRow, len(held.Sessions))
	for i, s := range held.Sessions {
		rows[i] = rowOf(s, releasable)
	}
	c.render(w, r, http.StatusOK, "sessions.html", "Held sessions of "+e.cfg.Path, map[string]any{
		"Entity": e.cfg.Path, "Rows": rows, "Listed": held.Listed, "Truncated": held.Truncated, "Queue": releasable,
		"Subscription": e.parsed.IsSubscription(), "WakeTo": e.cfg.WakeTo, "PropWakeTo": inspect.PropWakeTo,
	})
}

// describeReadError is what a page says of a failed read: a session entity's refusal of a plain
// receiver is named for what it is, never shown as the broker's raw error.
func describeReadError(err error) string {
	if isSessionRefusal(err) {
		return "the entity refused a plain receiver (it requires sessions, or it is a topic): a session entity is read session by session, on its held-sessions page"
	}
	return err.Error()
}

// releaseAt parses the planned time of a release form (Unix milliseconds), or returns now for a
// preview.
func releaseAt(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return now.UTC().Truncate(time.Millisecond), nil
	}
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("malformed release time %q", s)
	}
	return time.UnixMilli(ms).UTC(), nil
}

// planRelease plans the release of req's session, at the time the form carries (the preview's) or
// now, and returns it with its digest: the keyed hash of the entity, the session, the planned time,
// the states before and after and the wake-up's id. The run plans again from the session as it is and
// acts only if the digest is the preview's; Inspector.Release then refuses a session whose state
// changed since that plan.
func (c *Console) planRelease(ctx context.Context, req *request, at string) (*planned, error) {
	when, err := releaseAt(at, c.now())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", inspect.ErrInvalidRef, err)
	}
	rel, err := req.e.sessionIn.PreviewRelease(ctx, req.session, when)
	if err != nil {
		return nil, err
	}
	before, err := sessionstate.Marshal(rel.Plan.Before)
	if err != nil {
		return nil, err
	}
	after, err := sessionstate.Marshal(rel.Plan.After)
	if err != nil {
		return nil, err
	}
	p := &planned{release: rel}
	p.digest = c.mac("action", actionRelease, req.e.cfg.Path, req.session, strconv.FormatInt(rel.PlannedAt.UnixMilli(), 10), string(before), string(after), rel.Plan.WakeID, rel.WakeTo)
	return p, nil
}

// releaseStatus maps the errors of a release's plan or run to a status: 409 for a session that is
// locked, holds nothing any more, or changed since the preview; 400 for a state that is not a hold
// record or a session the request named wrong; else statusOf.
func releaseStatus(err error) int {
	switch {
	case errors.Is(err, inspect.ErrSessionLocked), errors.Is(err, sessionstate.ErrNotHeld), errors.Is(err, inspect.ErrSessionChanged):
		return http.StatusConflict
	case errors.Is(err, sessionstate.ErrForeign), errors.Is(err, inspect.ErrEmptySessionID):
		return http.StatusBadRequest
	}
	return statusOf(err)
}
