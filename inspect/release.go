package inspect

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/sessionstate"
)

// SessionRelease is an operator's release of a held session: the plan [sessionstate.PlanRelease] made from the
// session's state, and, after [Inspector.Release], what of it was done.
type SessionRelease struct {
	// Entity is the session entity (a queue, or a subscription) and SessionID the session.
	Entity    string
	SessionID string
	// WakeTo is where the wake-up is sent: the queue itself, or for a subscription [Options.WakeTo],
	// the wake-up then carrying [PropWakeTo].
	WakeTo string
	// Plan is the session's state before and after the release and the wake-up it sends.
	Plan sessionstate.ReleasePlan
	// PlannedAt is the time the plan was made for, in UTC to the millisecond: a held retry is made due
	// then.
	PlannedAt time.Time
	// WakeSent says the wake-up was sent; StateWritten that the new state was written after it. A
	// release that failed part way has WakeSent without StateWritten: the session is still blocked, and
	// the consumer ignores a wake-up its state does not name (run the release again).
	WakeSent     bool
	StateWritten bool
	// state is the raw state the plan was made from, so that the release can refuse a session that
	// changed since its preview.
	state []byte
}

// PropWakeTo is the application property a subscription's wake-up carries: the path of the
// subscription it is for ("topic/Subscriptions/sub"), for the topic's rules to route it there and
// nowhere else (see [Options.WakeTo]).
const PropWakeTo = "sbretry-wake-to"

// PreviewRelease plans the release of the session id of the inspected entity at now, and changes
// nothing: it accepts the session, reads its state, closes it at once and returns what
// [sessionstate.PlanRelease] plans, which [Inspector.Release] carries out. It refuses, with an error wrapping:
// [ErrSessionLocked], a session a consumer holds now; [sessionstate.ErrForeign], a state that is
// not a hold record (it is never overwritten); [sessionstate.ErrNotHeld], a session that holds nothing;
// [ErrEmptySessionID], an empty id. A subscription's session is released only with [Options.WakeTo]
// (its wake-up is sent there, carrying [PropWakeTo]); without it, [ErrUnknownEntity]: a plain send to
// its topic would reach every subscription.
//
// Like every read of a session, it locks the session for a moment (see [Inspector.ListHeldSessions]).
func (in *Inspector) PreviewRelease(ctx context.Context, id string, now time.Time) (*SessionRelease, error) {
	if err := in.releasable(id); err != nil {
		return nil, err
	}
	r, err := in.openSession(ctx, id)
	if err != nil {
		return nil, err
	}
	defer closeQuietly(ctx, r)
	// In UTC and to the millisecond, as the state records times: the state written is then exactly the
	// After shown, and reads back equal to it.
	return in.planRelease(ctx, r, id, now.UTC().Truncate(time.Millisecond))
}

// Release carries out the release preview planned, holding the session's lock throughout: it accepts
// the session, reads its state again and refuses, with an error wrapping [ErrSessionChanged] and
// nothing done, unless it is the state the preview read (the release does what was shown, or
// nothing); then it sends the wake-up (to the queue, or for a subscription to [Options.WakeTo]; a plain send, receivable at once), and only then
// writes the new state, and closes the session. Sending first means that a release interrupted between
// the two leaves the session blocked, with a wake-up its state does not name, which the consumer
// ignores, rather than unblocked with nothing to make a consumer take it up.
//
// Before writing the state it peeks the session for the wake-up: duplicate detection drops a message
// whose id it saw within its window without a word, and a state naming a wake-up that is not there
// would leave the session blocked. A wake-up not found returns an error wrapping [ErrWakeUpDropped],
// with WakeSent false and nothing written.
//
// It returns the release with WakeSent and StateWritten saying what was done, also with an error: a
// release whose wake-up went out and whose state write failed returns WakeSent and an error saying so;
// run it again. The errors of [Inspector.PreviewRelease] apply, for the session as it is now.
func (in *Inspector) Release(ctx context.Context, preview *SessionRelease) (*SessionRelease, error) {
	if preview == nil {
		return nil, fmt.Errorf("%w: nil release preview", ErrInvalidOptions)
	}
	id := preview.SessionID
	if err := in.releasable(id); err != nil {
		return nil, err
	}
	if !strings.EqualFold(preview.Entity, in.entity.Path()) {
		return nil, fmt.Errorf("%w: the preview is of %s, this inspector reads %s", ErrUnknownEntity, preview.Entity, in.entity)
	}
	r, err := in.openSession(ctx, id)
	if err != nil {
		return nil, err
	}
	defer closeQuietly(ctx, r)
	rel, err := in.planRelease(ctx, r, id, preview.PlannedAt)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(rel.state, preview.state) {
		return nil, fmt.Errorf("%w: %s session %q: its state is not the one the preview read; nothing was done, preview again", ErrSessionChanged, in.entity, id)
	}
	after, err := sessionstate.Marshal(rel.Plan.After)
	if err != nil {
		return nil, fmt.Errorf("inspect: encoding the new state of %s session %q: %w", in.entity, id, err)
	}
	s, err := in.sessions.entitySender()
	if err != nil {
		return nil, fmt.Errorf("inspect: opening a sender on %s: %w", in.entity, err)
	}
	defer closeQuietly(ctx, s)
	// Both calls are made under one lock, renewed first and not outlived: azservicebus retries a call
	// whose session lock was lost by accepting the session again (v1.11 takes a lost session lock for
	// retryable), and a write under that new lock could replace a record a consumer wrote meanwhile.
	// A LockedUntil that moves without a renewal of ours says the SDK took the session again.
	if err := r.RenewSessionLock(ctx, nil); err != nil {
		return rel, fmt.Errorf("inspect: renewing the lock of %s session %q before releasing it: %w; nothing was changed", in.entity, id, err)
	}
	until := r.LockedUntil()
	lctx, cancel := context.WithDeadline(ctx, until.Add(-min(releaseMargin, time.Until(until)/4)))
	defer cancel()
	relocked := func() bool { return !r.LockedUntil().Equal(until) }
	wake := rel.Plan.Wake
	err = in.observe(lctx, Call{Operation: OpSend, Entity: rel.WakeTo, MessageID: deref(wake.MessageID), SessionID: id, Properties: wake.ApplicationProperties}, func(ctx context.Context) (int, error) {
		return 0, s.SendMessage(ctx, wake, nil)
	})
	if err != nil {
		return rel, fmt.Errorf("inspect: sending the wake-up of %s session %q: %w; the state was not changed (a wake-up that went out all the same is ignored by the consumer)", in.entity, id, err)
	}
	// Duplicate detection drops, silently, a message whose id it saw within its window: a send that
	// returned nil is not yet a wake-up in the session. It is looked for there (no consumer can take it
	// while this release holds the lock) before the state is written to name it.
	kept, err := in.wakeKept(lctx, r, rel)
	switch {
	case err != nil:
		rel.WakeSent = true // sent; whether the broker kept it is not known
		return rel, fmt.Errorf("inspect: the wake-up of %s session %q was sent, but checking that the session holds it failed: %w; the state was not changed: preview again", in.entity, id, err)
	case !kept && in.entity.IsSubscription():
		return rel, fmt.Errorf("%w: %s session %q: the broker did not keep the wake-up %s in the session (the rules of the topic behind %s did not route a message carrying %s=%s to the subscription, or duplicate detection dropped it); the state was not changed", ErrWakeUpDropped, in.entity, id, deref(wake.MessageID), rel.WakeTo, PropWakeTo, in.entity.Path())
	case !kept:
		return rel, fmt.Errorf("%w: %s session %q: the broker did not keep the wake-up %s (duplicate detection dropped it: a message with its id was sent within the window); the state was not changed", ErrWakeUpDropped, in.entity, id, deref(wake.MessageID))
	}
	rel.WakeSent = true
	if relocked() {
		return rel, fmt.Errorf("%w: %s session %q: its lock was lost while the wake-up was sent; the state was not changed (the consumer ignores that wake-up): preview again", ErrSessionChanged, in.entity, id)
	}
	err = in.observe(lctx, Call{Operation: OpSetSessionState, Entity: in.entity.Path(), SessionID: id}, func(ctx context.Context) (int, error) {
		return 0, r.SetSessionState(ctx, after, nil)
	})
	if err != nil {
		return rel, fmt.Errorf("inspect: the wake-up of %s session %q was sent, but writing its new state failed: %w; the state may not have been written (the consumer ignores a wake-up its state does not name): preview again", in.entity, id, err)
	}
	rel.StateWritten = true
	if relocked() {
		// Written, but perhaps under a lock taken again after a consumer wrote: say so, never success.
		return rel, fmt.Errorf("%w: %s session %q: its lock was lost and taken again during the release; the state written may have replaced a newer record: list the session and check it", ErrSessionChanged, in.entity, id)
	}
	return rel, nil
}

// wakeKept reports whether the accepted session r holds the wake-up rel sent: it peeks the session's
// messages after the last one its record names (the wake-up, sent last, comes after them).
func (in *Inspector) wakeKept(ctx context.Context, r sessionReceiver, rel *SessionRelease) (bool, error) {
	from := int64(0)
	st := rel.Plan.Before
	if st.Hold != nil {
		from = max(from, st.Hold.SequenceNumber+1)
	}
	for _, f := range st.Followers {
		from = max(from, f+1)
	}
	want := deref(rel.Plan.Wake.MessageID)
	for {
		var page []*azservicebus.ReceivedMessage
		err := in.observe(ctx, Call{Operation: OpPeek, Entity: in.entity.Path(), SessionID: rel.SessionID}, func(ctx context.Context) (int, error) {
			var err error
			page, err = r.PeekMessages(ctx, wakePeekPage, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
			return len(page), err
		})
		if err != nil {
			return false, err
		}
		before := from
		for _, m := range page {
			if m.MessageID == want {
				return true, nil
			}
			if m.SequenceNumber != nil {
				from = max(from, *m.SequenceNumber+1)
			}
		}
		if len(page) < wakePeekPage {
			return false, nil
		}
		if from == before {
			return false, fmt.Errorf("inspect: peeking %s session %q from sequence number %d did not move on", in.entity, rel.SessionID, from)
		}
	}
}

// wakePeekPage is the page size of wakeKept's peeks.
const wakePeekPage = 100

// releaseMargin is how long before the session lock runs out a release's calls must end (a quarter of
// what is left of the lock, if that is less).
const releaseMargin = 2 * time.Second

// releasable refuses what a release cannot act on before anything is opened.
func (in *Inspector) releasable(id string) error {
	if id == "" {
		return ErrEmptySessionID
	}
	if in.entity.IsSubscription() && in.opts.WakeTo == "" {
		return fmt.Errorf("%w: %s is a subscription: a release sends a wake-up, and a send to its topic reaches every subscription whose rules accept it; set Options.WakeTo where the topic's rules route a wake-up carrying %s to this subscription alone", ErrUnknownEntity, in.entity, PropWakeTo)
	}
	return nil
}

// planRelease reads the state of the accepted session r and plans its release at now.
func (in *Inspector) planRelease(ctx context.Context, r sessionReceiver, id string, now time.Time) (*SessionRelease, error) {
	raw, err := in.sessionState(ctx, r, id)
	if err != nil {
		return nil, err
	}
	state, err := sessionstate.Decode(raw)
	if err != nil {
		// Another application's state, or an invalid record: never overwritten.
		return nil, fmt.Errorf("inspect: %s session %q: %w; it is left alone", in.entity, id, err)
	}
	plan, err := sessionstate.PlanRelease(id, state, now)
	if err != nil {
		return nil, fmt.Errorf("inspect: %s session %q: %w", in.entity, id, err)
	}
	rel := &SessionRelease{Entity: in.entity.Path(), SessionID: id, Plan: plan, PlannedAt: now, WakeTo: in.entity.Path(), state: raw}
	if in.entity.IsSubscription() {
		// The topic's rules route the wake-up by the subscription it names.
		props := make(map[string]any, len(plan.Wake.ApplicationProperties)+1)
		for k, v := range plan.Wake.ApplicationProperties {
			props[k] = v
		}
		props[PropWakeTo] = in.entity.Path()
		wake := *plan.Wake
		wake.ApplicationProperties = props
		rel.Plan.Wake, rel.WakeTo = &wake, in.opts.WakeTo
	}
	return rel, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
