package inspect

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sessionstate"
)

// HeldSession is a session of a session entity that a durable hold of retry.SessionConsumer blocks (see
// [sessionstate.State]), as [Inspector.ListHeldSessions] and [Inspector.HeldSession] read it: its state,
// and what a peek inside the session shows of the messages the hold involves.
type HeldSession struct {
	// Entity is the session entity (a queue or a subscription) and SessionID the session.
	Entity    string
	SessionID string

	// Locked says a receiver (a consumer) held the session's lock when it was read, so that nothing of
	// it could be read: a session entity is read only through a receiver holding the session. LockErr
	// is the refused accept. The session is listed because it has a state; whether that state is a hold
	// is not known.
	Locked  bool
	LockErr error
	// ReadErr is set when the session could not be read for another reason (an accept, a state read
	// or a peek failed): the listing goes on with the next session, and this one says why.
	ReadErr error

	// State is the session's durable hold record. StateErr is set instead when the session's state is
	// not one: it wraps [sessionstate.ErrForeign] for another application's state (or a newer
	// version's), or is the decode error of an invalid record. Such a state is shown, never changed.
	// StateSize is the state's size in bytes.
	State     sessionstate.State
	StateErr  error
	StateSize int

	// Deferred are the session's deferred messages, in sequence-number order: the held message (with
	// [sessionstate.PropHeldUntil]) and the ones deferred behind it ([sessionstate.PropHeldBehind]).
	Deferred []SessionMessage
	// WakeUps are the wake-up control messages found in the session ([sessionstate.ControlWake]): scheduled
	// for when the retry is due, or receivable already (due, or sent by a release).
	WakeUps []WakeUp
	// Scan says how much of the session the peek read (Entity is the session entity); zero when the
	// session was locked.
	Scan Scan
}

// Hold is what blocks the session, from its state: nil when nothing is held (followers only), when
// the state is not a record, or when the session was locked.
func (s HeldSession) Hold() *sessionstate.Hold { return s.State.Hold }

// HeldMessage is the held message among Deferred (the one the state's Hold names), nil when the peek
// did not find it (it was dead-lettered, or the peek stopped at [Options.MaxPeek] before it).
func (s HeldSession) HeldMessage() *SessionMessage {
	h := s.State.Hold
	if h == nil {
		return nil
	}
	for i := range s.Deferred {
		if s.Deferred[i].SequenceNumber == h.SequenceNumber {
			return &s.Deferred[i]
		}
	}
	return nil
}

// NextWakeUp is the wake-up of the current hold (the one whose MessageID the state names, else the
// earliest one for the held message), nil when none was found.
func (s HeldSession) NextWakeUp() *WakeUp {
	h := s.State.Hold
	if h == nil {
		return nil
	}
	var best *WakeUp
	for i := range s.WakeUps {
		w := &s.WakeUps[i]
		if h.WakeID != "" && w.MessageID == h.WakeID {
			return w
		}
		if w.ForSequenceNumber == h.SequenceNumber && (best == nil || w.DueTime.Before(best.DueTime)) {
			best = w
		}
	}
	return best
}

// SessionMessage is a deferred message of a held session, with the properties the hold stamped on it.
type SessionMessage struct {
	// SequenceNumber is its number in the entity, MessageID its id.
	SequenceNumber int64
	MessageID      string
	// HeldUntil is [sessionstate.PropHeldUntil]: when the held message's next attempt is due. Zero for a
	// message deferred behind another.
	HeldUntil time.Time
	// HeldBehind is [sessionstate.PropHeldBehind]: the sequence number of the held message it waits behind,
	// -1 when it carries none.
	HeldBehind int64
	// Attempt is [envelope.PropAttempt], 0 when absent; LastError is [envelope.PropLastError].
	Attempt   int
	LastError string
}

// WakeUp is a wake-up control message in a held session.
type WakeUp struct {
	// SequenceNumber is its number in the entity (a scheduled message is numbered again when it
	// activates), MessageID its id.
	SequenceNumber int64
	MessageID      string
	// Scheduled says it is not receivable yet; DueTime is then when it will be (ScheduledEnqueueTime),
	// else when it became receivable (EnqueuedTime).
	Scheduled bool
	DueTime   time.Time
	// ForSequenceNumber is [sessionstate.PropWakeSequenceNumber], the held message it is for; -1 for a
	// release's wake-up of a session that holds no message.
	ForSequenceNumber int64
}

// HeldSessions is the answer of [Inspector.ListHeldSessions].
type HeldSessions struct {
	// Entity is the session entity listed.
	Entity string
	// Sessions are the held sessions, in the order Service Bus listed them (by session id).
	Sessions []HeldSession
	// Listed is the number of sessions with a state that were read, held or not.
	Listed int
	// Truncated says the listing stopped at [Options.MaxSessions].
	Truncated bool
}

// ListHeldSessions lists the held sessions of the inspected entity, a session-enabled queue or
// subscription: every session that has a state is read (see [Inspector.HeldSession]), and those whose
// state is a hold record that blocks the session, whose state is not a record, or that a consumer held
// at that moment are returned. At most [Options.MaxSessions] sessions are read.
//
// Reading a session locks it for the time of one state read and one peek: a consumer that would
// accept it then (a wake-up falling due, a new message of the session) waits until the inspector
// closes it, a moment later.
func (in *Inspector) ListHeldSessions(ctx context.Context) (*HeldSessions, error) {
	if in.sessions == nil {
		return nil, fmt.Errorf("inspect: %s: no session links", in.entity)
	}
	out := &HeldSessions{Entity: in.entity.Path()}
	pager := in.sessions.statefulSessions()
	for pager.More() {
		var page azservicebus.ListSessionsResponse
		err := in.observe(ctx, Call{Operation: OpListSessions, Entity: out.Entity}, func(ctx context.Context) (int, error) {
			var err error
			page, err = pager.NextPage(ctx)
			return len(page.Sessions), err
		})
		if err != nil {
			return out, fmt.Errorf("inspect: listing the sessions of %s: %w", out.Entity, err)
		}
		for _, id := range page.Sessions {
			if out.Listed == in.opts.MaxSessions {
				out.Truncated = true
				return out, nil
			}
			out.Listed++
			s, err := in.HeldSession(ctx, id)
			switch {
			case err == nil:
				out.Sessions = append(out.Sessions, *s)
			case errors.Is(err, sessionstate.ErrNotHeld):
			case ctx.Err() != nil:
				return out, err
			default:
				// One session that cannot be read does not hide the others: it is listed as unreadable.
				out.Sessions = append(out.Sessions, HeldSession{Entity: out.Entity, SessionID: id, ReadErr: err})
			}
		}
	}
	return out, nil
}

// HeldSession reads the session id of the inspected entity: it accepts the session, reads and decodes
// its state, peeks its messages (at most [Options.MaxPeek]) and closes it at once. It returns the
// session, with Locked set when a receiver holds it (nothing could be read), or StateErr set when its
// state is not a hold record; an error wrapping [sessionstate.ErrNotHeld] when its state holds nothing.
//
// Like every read of a session, it locks the session for a moment (see [Inspector.ListHeldSessions]).
func (in *Inspector) HeldSession(ctx context.Context, id string) (*HeldSession, error) {
	if id == "" {
		return nil, ErrEmptySessionID
	}
	s := &HeldSession{Entity: in.entity.Path(), SessionID: id}
	r, err := in.openSession(ctx, id)
	if errors.Is(err, ErrSessionLocked) {
		s.Locked, s.LockErr = true, err
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	defer closeQuietly(ctx, r)
	raw, err := in.sessionState(ctx, r, id)
	if err != nil {
		return nil, err
	}
	s.StateSize = len(raw)
	s.State, s.StateErr = sessionstate.Decode(raw)
	if s.StateErr == nil && !s.State.Blocked() {
		return nil, fmt.Errorf("%w: %s session %q", sessionstate.ErrNotHeld, s.Entity, id)
	}
	s.Scan, err = in.peekSession(ctx, r, id, s)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// peekSession peeks the accepted session r in sequence-number order, up to [Options.MaxPeek]
// messages, and records its deferred messages and wake-ups in s.
func (in *Inspector) peekSession(ctx context.Context, r sessionReceiver, id string, s *HeldSession) (Scan, error) {
	sc := Scan{Entity: s.Entity}
	from := int64(0)
	for {
		want := min(in.opts.PeekBatchSize, in.opts.MaxPeek-sc.Peeked)
		if want <= 0 {
			sc.Truncated = true
			return sc, nil
		}
		start := from
		var msgs []*azservicebus.ReceivedMessage
		err := in.observe(ctx, Call{Operation: OpPeek, Entity: sc.Entity, SessionID: id}, func(ctx context.Context) (int, error) {
			var err error
			msgs, err = r.PeekMessages(ctx, want, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &start})
			return len(msgs), err
		})
		sc.Requests++
		if err != nil {
			return sc, fmt.Errorf("inspect: peeking %s session %q from sequence number %d: %w", sc.Entity, id, from, err)
		}
		if len(msgs) == 0 {
			return sc, nil
		}
		for _, m := range msgs[:min(len(msgs), want)] {
			sc.Peeked++
			if m.SequenceNumber != nil && *m.SequenceNumber >= from {
				from = *m.SequenceNumber + 1
			}
			classifySessionMessage(m, s)
		}
		if from == start {
			return sc, fmt.Errorf("inspect: peeking %s session %q: reply without sequence numbers beyond %d", sc.Entity, id, start)
		}
	}
}

// classifySessionMessage records m in s when it is a deferred message or a wake-up.
func classifySessionMessage(m *azservicebus.ReceivedMessage, s *HeldSession) {
	props := m.ApplicationProperties
	if kind, _ := props[sessionstate.PropControl].(string); kind == sessionstate.ControlWake {
		w := WakeUp{SequenceNumber: seqOf(m), MessageID: m.MessageID, Scheduled: m.State == azservicebus.MessageStateScheduled, ForSequenceNumber: -1}
		if n, ok := asInt64(props[sessionstate.PropWakeSequenceNumber]); ok {
			w.ForSequenceNumber = n
		}
		switch {
		case w.Scheduled && m.ScheduledEnqueueTime != nil:
			w.DueTime = m.ScheduledEnqueueTime.UTC()
		case m.EnqueuedTime != nil:
			w.DueTime = m.EnqueuedTime.UTC()
		}
		s.WakeUps = append(s.WakeUps, w)
		return
	}
	if m.State != azservicebus.MessageStateDeferred {
		return
	}
	d := SessionMessage{SequenceNumber: seqOf(m), MessageID: m.MessageID, HeldBehind: -1}
	if t, ok := props[sessionstate.PropHeldUntil].(time.Time); ok {
		d.HeldUntil = t.UTC()
	}
	if n, ok := asInt64(props[sessionstate.PropHeldBehind]); ok {
		d.HeldBehind = n
	}
	if n, ok := asInt64(props[envelope.PropAttempt]); ok && n > 0 && n <= 1<<31-1 {
		d.Attempt = int(n)
	}
	d.LastError, _ = props[envelope.PropLastError].(string)
	s.Deferred = append(s.Deferred, d)
}

// asInt64 reads an integer application property, whatever integer type the sender used.
func asInt64(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case int:
		return int64(n), true
	case uint32:
		return int64(n), true
	}
	return 0, false
}
