package sbemu

import (
	"errors"
	"fmt"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

// handleDisposition applies a client receiver's settlement of peek-lock
// deliveries. The SDK receives in rcv-settle-mode second, so it waits for
// the emulator's settled disposition; each delivery is answered on its own
// with the outcome actually applied:
//
//	accepted                              -> Complete, answered accepted
//	modified                              -> Abandon (annotations merged), answered modified
//	modified{undeliverable-here}          -> Defer (annotations merged), answered modified
//	rejected{com.microsoft:dead-letter}   -> DeadLetter, answered rejected without error
//	released                              -> Release, answered released
//	lock unknown or expired               -> rejected{com.microsoft:message-lock-lost}
func (s *session) handleDisposition(d *wire.Disposition) {
	if d.Role != wire.RoleReceiver {
		// The client settling its own transfers: the emulator always
		// settles first, so there is nothing to confirm.
		return
	}
	// A disposition covers the range first..last (section 2.7.6); an absent
	// last means just first. The loop ends on id == last rather than id <=
	// last so a range that wraps around 2^32 still works.
	last := d.First
	if d.Last != nil {
		last = *d.Last
	}
	for id := d.First; ; id++ {
		s.mu.Lock()
		sd := s.unsettled[id]
		// The record is removed before the broker is called, so a disposition
		// sent twice for the same id is answered as unknown (lock lost) the
		// second time instead of being applied twice.
		delete(s.unsettled, id)
		active := sd != nil && sd.link.activeLocked()
		s.mu.Unlock()

		switch {
		case sd != nil && !active:
			// The emulator detached the link while this disposition was in
			// flight. Applying it would settle a message the client is
			// about to settle again through the management link (the
			// SDK's fallback on a link error), turning a success into a
			// lock-lost; leave the lock for that retry instead.
		case sd == nil:
			if !d.Settled {
				s.send(&wire.Disposition{Role: wire.RoleSender, First: id, Settled: true, State: lockLostState("sbemu: unknown delivery id")})
			}
		default:
			reply := s.settle(sd, d.State)
			// A client that settled on its own side expects no answer; the
			// SDK receives in rcv-settle-mode second and so always waits
			// for this one. With persistence the outcome waits for the disk
			// (see durable.go).
			switch {
			case d.Settled:
			case s.c.em.persistent:
				id := id
				s.c.em.broker.AfterSync(func(err error) { s.answerSettlement(sd, id, durableOutcome(reply, err)) })
			default:
				s.answerSettlement(sd, id, reply)
			}
		}
		if id == last {
			break
		}
	}
}

// answerSettlement sends the outcome of a settlement, unless the link has
// gone meanwhile.
func (s *session) answerSettlement(sd *sentDelivery, id uint32, reply wire.DeliveryState) {
	s.mu.Lock()
	if sd.link.activeLocked() {
		s.sendLocked(&wire.Disposition{Role: wire.RoleSender, First: id, Settled: true, State: reply})
	}
	s.mu.Unlock()
}

// settle applies one delivery outcome to the broker and returns the state
// to report back.
func (s *session) settle(sd *sentDelivery, state wire.DeliveryState) wire.DeliveryState {
	if cond, ok := s.c.em.faults.TakeSettleRejection(); ok {
		return &wire.Rejected{Error: &wire.Error{Condition: wire.Symbol(cond), Description: "sbemu: settlement rejected by fault injection"}}
	}
	q, token := sd.queue, sd.token
	var err error
	var reply wire.DeliveryState
	switch st := state.(type) {
	case *wire.Accepted:
		err = q.Complete(token)
		reply = &wire.Accepted{}
	case *wire.Modified:
		// The SDK's Defer sends modified{undeliverable-here=true}, its
		// Abandon modified{undeliverable-here=false} (messageSettler.go).
		if st.UndeliverableHere {
			err = q.Defer(token, annotationsFromWire(st.MessageAnnotations))
		} else {
			err = q.Abandon(token, annotationsFromWire(st.MessageAnnotations))
		}
		reply = &wire.Modified{DeliveryFailed: st.DeliveryFailed, UndeliverableHere: st.UndeliverableHere}
	case *wire.Rejected:
		reason, desc, props := deadLetterInfo(st.Error)
		err = q.DeadLetter(token, reason, desc, props)
		reply = &wire.Rejected{}
	// A disposition without state is treated as released, the conservative
	// outcome: the message comes back without its delivery being counted.
	case *wire.Released, nil:
		err = q.Release(token)
		reply = &wire.Released{}
	default:
		return &wire.Rejected{Error: &wire.Error{Condition: condNotImplemented, Description: fmt.Sprintf("sbemu: unsupported outcome %T", state)}}
	}
	if err != nil {
		return settleErrorState(err)
	}
	return reply
}

// settleErrorState maps a broker settlement error to the rejected state the
// SDK understands.
func settleErrorState(err error) wire.DeliveryState {
	switch {
	case errors.Is(err, broker.ErrEntityDisabled):
		return &wire.Rejected{Error: &wire.Error{Condition: condEntityDisabled, Description: disabledDescription(err)}}
	case errors.Is(err, broker.ErrLockLost):
		return lockLostState("sbemu: the lock expired, or the message was settled or released")
	case errors.Is(err, broker.ErrNotSupported):
		return &wire.Rejected{Error: &wire.Error{Condition: condNotAllowed, Description: "sbemu: " + err.Error()}}
	case errors.Is(err, broker.ErrUnknownQueue):
		// The entity was deleted while the message was locked.
		return &wire.Rejected{Error: &wire.Error{Condition: condNotFound, Description: "sbemu: " + err.Error()}}
	default:
		return &wire.Rejected{Error: &wire.Error{Condition: condInternalError, Description: "sbemu: " + err.Error()}}
	}
}

// lockLostState is the outcome the SDK surfaces as CodeLockLost, described
// as Service Bus describes it, followed by the emulator's detail.
func lockLostState(detail string) wire.DeliveryState {
	return &wire.Rejected{Error: &wire.Error{Condition: condLockLost, Description: lockLostDescription + " " + detail}}
}

// deadLetterInfo extracts DeadLetterReason and DeadLetterErrorDescription
// from a rejected outcome's error info; the remaining info entries are the
// SDK's PropertiesToModify. A rejection without the dead-letter condition
// dead-letters with the condition as reason, like Service Bus.
func deadLetterInfo(e *wire.Error) (reason, desc string, props map[string]any) {
	if e == nil {
		return "", "", nil
	}
	if e.Condition != condDeadLetter {
		reason, desc = string(e.Condition), e.Description
	}
	if e.Info == nil {
		return reason, desc, nil
	}
	for _, ent := range e.Info.Entries {
		key, ok := mapKeyString(ent.Key)
		if !ok {
			continue
		}
		// fromWire turns wire types into go-amqp types, so the broker stores the
		// values with the types the SDK expects when it reads them back.
		v := fromWire(ent.Value)
		switch key {
		case broker.PropertyDeadLetterReason:
			if str, ok := v.(string); ok {
				reason = str
			}
		case broker.PropertyDeadLetterErrorDescription:
			if str, ok := v.(string); ok {
				desc = str
			}
		default:
			if props == nil {
				props = map[string]any{}
			}
			props[key] = v
		}
	}
	return reason, desc, props
}

// annotationsFromWire converts a modified outcome's message annotations to
// the map the broker merges into application properties.
func annotationsFromWire(m *wire.Map) map[any]any {
	if m.Len() == 0 {
		return nil
	}
	out := make(map[any]any, m.Len())
	for _, ent := range m.Entries {
		if key, ok := mapKeyString(ent.Key); ok {
			out[key] = fromWire(ent.Value)
		}
	}
	return out
}

// mapKeyString accepts the string and symbol keys the SDK uses.
func mapKeyString(k any) (string, bool) {
	switch k := k.(type) {
	case string:
		return k, true
	case wire.Symbol:
		return string(k), true
	}
	return "", false
}
