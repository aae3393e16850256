package sessionstate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// The durable hold's record, kept in the session's own state (Service Bus session state, which lives
// with the session on the broker whether or not a receiver holds it). A consumer reads it when it
// accepts the session and writes it before every deferral, so that a consumer killed at any point
// finds, in the session itself, what blocks the session and in which order the deferred messages run.
// The file holds the format and the operator's release; sessiondurable.go holds the consumer's side.

// Properties of the messages a durable hold involves.
const (
	// PropControl marks a control message of the session consumer: PropControl = [ControlWake] is the
	// wake-up scheduled into a held session for when its retry is due. Wake-ups never reach the
	// handler.
	PropControl = "sbretry-control"
	// PropWakeSequenceNumber is the sequence number of the held message a wake-up is for (int64).
	PropWakeSequenceNumber = "sbretry-wake-sequence-number"
	// PropHeldUntil is stamped on a message deferred by a durable hold: when its next attempt is due
	// (a timestamp). A peek of the entity shows it without locking the session.
	PropHeldUntil = "sbretry-held-until"
	// PropHeldBehind is stamped on a message deferred behind a held one: the held message's sequence
	// number (int64).
	PropHeldBehind = "sbretry-held-behind"
)

// ControlWake is the PropControl value of a wake-up message.
const ControlWake = "wake"

// Format is the value of the "format" field that marks a session state as the durable
// hold's record, version 1. A session state without it (another application's) is never overwritten.
const Format = "sbretry/v1"

// MaxFollowers bounds how many messages may be deferred behind one hold: their sequence numbers are
// listed in the session state, which Service Bus bounds by the entity's message size (256 KiB on the
// standard tier). 10,000 numbers of up to 19 digits take under 200 KiB. A message arriving behind a
// full list is dead-lettered with DeadLetterReasons.SessionBacklogFull instead of deferred.
const MaxFollowers = 10000

// State is the durable hold's record in a session's state: what blocks the session and what
// waits behind it. Read one with [Decode]. The zero value means nothing is held.
type State struct {
	// Hold is the message that blocks the session, nil when none does (the followers, if any, then run
	// next, in order).
	Hold *Hold
	// Followers are the sequence numbers of the session's messages deferred behind the hold, in the
	// order they arrived: they run in this order once the hold ends.
	Followers []int64
}

// Hold is the message that blocks a held session.
type Hold struct {
	// SequenceNumber identifies the held message, deferred in its session; MessageID is its id.
	SequenceNumber int64
	MessageID      string
	// Attempt is the attempt its next handler call will be (as Envelope.Attempt).
	Attempt int
	// FirstFailure is when its first attempt failed.
	FirstFailure time.Time
	// WakeAt is when the next attempt is due, and WakeID the MessageID of the wake-up message scheduled
	// into the session for then. Both are zero for a session blocked after a dead-letter.
	WakeAt time.Time
	WakeID string
	// LastError is the text of the latest failure, as Envelope.LastError.
	LastError string
	// ImmediateRetries is how many of the policy's immediate retries the message has made since its
	// last delayed retry (its first failure, at first), this hold's included when it waits
	// ImmediateDelay: a resumed hold goes on from there, so that holds made durable (a MaxHold below
	// ImmediateDelay) still come to the backoff. Zero for a hold that waits the backoff.
	ImmediateRetries int
	// DeadLetterReason is set when the message was dead-lettered and the session stays blocked until an
	// operator releases it (SessionOptions.BlockAfterDeadLetter); the message is then in the
	// dead-letter queue, no longer in the session.
	DeadLetterReason string
	// DeadLetteredAt is when it was dead-lettered.
	DeadLetteredAt time.Time
}

// Blocked reports whether the session's new messages must wait: something is held or deferred.
func (s State) Blocked() bool { return s.Hold != nil || len(s.Followers) > 0 }

// wireState is the JSON form of State. Field names are short and stable: the record is read by
// other versions of the consumer and by the operator tools.
type wireState struct {
	Format    string    `json:"format"`
	Hold      *wireHold `json:"hold,omitempty"`
	Followers []int64   `json:"followers,omitempty"`
}

type wireHold struct {
	Seq            int64     `json:"seq"`
	MessageID      string    `json:"id,omitempty"`
	Attempt        int       `json:"attempt"`
	FirstFailure   time.Time `json:"first_failure"`
	WakeAt         time.Time `json:"wake_at,omitzero"`
	WakeID         string    `json:"wake_id,omitempty"`
	LastError      string    `json:"last_error,omitempty"`
	Immediate      int       `json:"immediate,omitempty"`
	DeadLetter     string    `json:"dead_letter_reason,omitempty"`
	DeadLetteredAt time.Time `json:"dead_lettered_at,omitzero"`
}

// ErrForeign is returned by [Decode] for a state that is not the durable
// hold's record: another application's, or one written by a newer version. The consumer leaves such a
// state alone and holds that session in place only.
var ErrForeign = errors.New("retry: the session state is not a durable hold record")

// ErrInvalid is returned by [Decode] for a record with this version's format
// marker but impossible contents. The consumer treats it as it treats a foreign state: left alone.
var ErrInvalid = errors.New("retry: invalid durable hold record")

// Decode reads a session's state. An empty state is the zero State (nothing held).
// A state that is not JSON, or JSON without this version's format marker, returns an error wrapping
// [ErrForeign]; a record with the marker but impossible contents (a negative sequence
// number, an attempt below 2, a follower listed twice) returns one wrapping [ErrInvalid].
func Decode(b []byte) (State, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return State{}, nil
	}
	var w wireState
	if err := json.Unmarshal(b, &w); err != nil || w.Format != Format {
		return State{}, fmt.Errorf("%w (%d bytes)", ErrForeign, len(b))
	}
	s := State{Followers: w.Followers}
	seen := make(map[int64]bool, len(w.Followers)+1)
	if h := w.Hold; h != nil {
		if h.Seq < 0 || h.Attempt < 2 || h.Immediate < 0 || h.Immediate >= h.Attempt {
			return State{}, fmt.Errorf("%w: hold with sequence number %d, attempt %d, %d immediate retries", ErrInvalid, h.Seq, h.Attempt, h.Immediate)
		}
		seen[h.Seq] = true
		s.Hold = &Hold{
			SequenceNumber: h.Seq, MessageID: h.MessageID, Attempt: h.Attempt, FirstFailure: h.FirstFailure,
			WakeAt: h.WakeAt, WakeID: h.WakeID, LastError: h.LastError, ImmediateRetries: h.Immediate,
			DeadLetterReason: h.DeadLetter, DeadLetteredAt: h.DeadLetteredAt,
		}
	}
	for _, f := range w.Followers {
		if f < 0 || seen[f] {
			return State{}, fmt.Errorf("%w: invalid or repeated follower %d", ErrInvalid, f)
		}
		seen[f] = true
	}
	return s, nil
}

// encode returns the state's record; the zero state encodes as nil, which clears the session state.
func (s State) encode() ([]byte, error) {
	if !s.Blocked() {
		return nil, nil
	}
	w := wireState{Format: Format, Followers: s.Followers}
	if h := s.Hold; h != nil {
		w.Hold = &wireHold{
			Seq: h.SequenceNumber, MessageID: h.MessageID, Attempt: h.Attempt, FirstFailure: h.FirstFailure.UTC(),
			WakeAt: h.WakeAt.UTC(), WakeID: h.WakeID, LastError: h.LastError, Immediate: h.ImmediateRetries,
			DeadLetter: h.DeadLetterReason, DeadLetteredAt: h.DeadLetteredAt.UTC(),
		}
	}
	return json.Marshal(w)
}

// Follows reports whether seq is listed among the followers.
func (s State) Follows(seq int64) bool {
	for _, f := range s.Followers {
		if f == seq {
			return true
		}
	}
	return false
}

// WakeID is the MessageID of the wake-up into session sessionID for attempt of the message seq, due
// at; tag tells apart wake-ups that have the same session, message, attempt and time but not the same
// purpose (an operator's release names the record it replaces). Deterministic, so that duplicate
// detection absorbs a wake-up scheduled twice, and distinct per session and schedule: a wake-up that
// duplicate detection took for another session's would be dropped, and that session never woken. The
// session and tag enter as 16 hex digits of a hash, keeping the id within 128 characters whatever
// their length.
func WakeID(sessionID string, seq int64, attempt int, at time.Time, tag []byte) string {
	h := sha256.New()
	h.Write([]byte(strconv.Itoa(len(sessionID))))
	h.Write([]byte{':'})
	h.Write([]byte(sessionID))
	h.Write(tag)
	var sum [sha256.Size]byte
	return "sbretry-wake-" + hex.EncodeToString(h.Sum(sum[:0])[:8]) + "-" + strconv.FormatInt(seq, 10) + "-" + strconv.Itoa(attempt) + "-" + strconv.FormatInt(at.UnixMilli(), 10)
}

// WakeMessage is the wake-up of hold, into session sessionID: an empty body, the control properties.
func WakeMessage(sessionID string, h *Hold) *azservicebus.Message {
	id, sid := h.WakeID, sessionID
	return &azservicebus.Message{
		MessageID: &id,
		SessionID: &sid,
		Subject:   strPtr("sbretry wake-up"),
		ApplicationProperties: map[string]any{
			PropControl:            ControlWake,
			PropWakeSequenceNumber: h.SequenceNumber,
		},
	}
}

func strPtr(s string) *string { return &s }

// NoHeldMessage is the sequence number a wake-up names when it is for no held message: an operator's
// release of a session blocked after a dead-letter, which only brings a consumer to the session.
const NoHeldMessage = -1

// IsWakeUp reports whether msg is a wake-up of a durable hold, and the sequence number of the held
// message it is for ([NoHeldMessage] for a release that names none).
func IsWakeUp(msg *azservicebus.ReceivedMessage) (forSequenceNumber int64, ok bool) {
	if msg == nil {
		return 0, false
	}
	if kind, _ := msg.ApplicationProperties[PropControl].(string); kind != ControlWake {
		return 0, false
	}
	n, isLong := msg.ApplicationProperties[PropWakeSequenceNumber].(int64)
	if !isLong {
		n = NoHeldMessage
	}
	return n, true
}

// ReleasePlan is what [PlanRelease] would change in a held session: its state before and after, and
// the wake-up message that makes a consumer take the session up again.
type ReleasePlan struct {
	Before, After State
	// Wake is scheduled for now (sent at once): without a message that can be received, no consumer
	// accepts a session whose messages are all deferred. WakeID is its MessageID, and WakeFor the
	// sequence number of the held message it is for ([NoHeldMessage] when none).
	Wake    *azservicebus.Message
	WakeID  string
	WakeFor int64
}

// ErrNotHeld is returned by [PlanRelease] for a session whose state holds nothing.
var ErrNotHeld = errors.New("retry: the session holds nothing to release")

// PlanRelease plans an operator's release of session sessionID, whose current state is state: a
// session blocked after a dead-letter is unblocked (its followers run next, in order, after the
// dead-lettered message if it is still there: see below); a session
// waiting for a retry has the retry made due now (now in UTC, to the millisecond, as the record keeps
// it). The plan changes nothing by itself: the operator tools show it in a dry run and apply it while
// holding the session's lock by first sending Wake, then writing After as the session state
// ([Marshal]). Send first: a release interrupted between the two then leaves the session
// blocked (and the wake-up ignored) rather than unblocked with nothing to make a consumer take it up.
func PlanRelease(sessionID string, state State, now time.Time) (ReleasePlan, error) {
	if !state.Blocked() {
		return ReleasePlan{}, ErrNotHeld
	}
	now = now.UTC().Truncate(time.Millisecond)
	// The record released is the wake-up's tag: a later release of the same session at the same
	// planned time (a script that passes one now) releases another record, with a wake-up of its own.
	tag, err := state.encode()
	if err != nil {
		return ReleasePlan{}, err
	}
	after := State{Followers: append([]int64(nil), state.Followers...)}
	plan := ReleasePlan{Before: state}
	var wakeFor *Hold
	if h := state.Hold; h != nil && h.DeadLetterReason == "" {
		nh := *h
		nh.WakeAt = now
		nh.WakeID = WakeID(sessionID, h.SequenceNumber, h.Attempt, now, tag)
		after.Hold = &nh
		wakeFor = &nh
	} else {
		// Blocked after a dead-letter, or followers waiting with nothing held (a consumer stopped
		// between two of them): the wake-up names no message, it only brings a consumer.
		wakeFor = &Hold{SequenceNumber: NoHeldMessage, WakeID: WakeID(sessionID, NoHeldMessage, 0, now, tag)}
		if h != nil {
			// The record of a dead-letter is written before the dead-letter itself, so a consumer that
			// stopped between the two left the message in the session. It heads the followers: the
			// consumer looks it up first and skips it if it is gone (dead-lettered, the usual case),
			// or runs it again if it is still there, so that nothing stays deferred unnamed.
			after.Followers = append([]int64{h.SequenceNumber}, after.Followers...)
		}
	}
	plan.After = after
	plan.Wake = WakeMessage(sessionID, wakeFor)
	plan.WakeID, plan.WakeFor = wakeFor.WakeID, wakeFor.SequenceNumber
	return plan, nil
}

// Marshal returns the record of s to write as a session's state; nil (clearing the
// state) when s holds nothing.
func Marshal(s State) ([]byte, error) { return s.encode() }

// Without is s with seq neither held nor following (the hold stays when it is another message's).
func (s State) Without(seq int64) State {
	next := State{Hold: s.Hold}
	if s.Hold != nil && s.Hold.SequenceNumber == seq {
		next.Hold = nil
	}
	for _, f := range s.Followers {
		if f != seq {
			next.Followers = append(next.Followers, f)
		}
	}
	return next
}

// Equal reports whether s and o are the same record.
func (s State) Equal(o State) bool {
	if (s.Hold == nil) != (o.Hold == nil) || (s.Hold != nil && *s.Hold != *o.Hold) {
		return false
	}
	return slices.Equal(s.Followers, o.Followers)
}
