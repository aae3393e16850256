package retry

import (
	"fmt"
)

// A Consumer retries by scheduling a copy of the failed message (decision.go). On a session-enabled
// entity the copy keeps the message's SessionID, so it rejoins its session behind every message that
// arrived meanwhile: the session's order is lost. The consumer refuses such an entity when it can tell,
// unless Options.AllowReorder accepts the reordering; [SessionConsumer] is the consumer that keeps the
// order. This file is that refusal; the settings check's half is in reconnect.go (checkSettings).

// sessionHolder is what a receiver of one session has and a plain receiver lacks: its session's id, as
// *azservicebus.SessionReceiver (and retrytest's SessionReceiver) report it. A Receiver built on one
// (the SDK's session receiver has no RenewMessageLock, so it takes an adapter that embeds it) shows it.
type sessionHolder interface {
	SessionID() string
}

// refuseSessionReceivers returns an error wrapping [ErrSessionEntity] when a receiver of conn (its
// Receiver or a Source's) holds a session and Options.AllowReorder is not set. entity names conn's
// Receiver when its EntityPath is empty.
func (c *config) refuseSessionReceivers(conn *Connection, entity string) error {
	if c.allowReorder {
		return nil
	}
	if conn.EntityPath != "" {
		entity = conn.EntityPath
	}
	check := func(r Receiver, entity string) error {
		if s, ok := r.(sessionHolder); ok {
			return fmt.Errorf("%w (the receiver of %s holds session %q)", ErrSessionEntity, orUnnamed(entity), s.SessionID())
		}
		return nil
	}
	if err := check(conn.Receiver, entity); err != nil {
		return err
	}
	for _, s := range conn.Sources {
		if s.Receiver == nil {
			continue
		}
		if err := check(s.Receiver, s.EntityPath); err != nil {
			return err
		}
	}
	return nil
}

// sessionSettingsWarning is the Health warning of a consumer that runs on a session-enabled entity with
// Options.AllowReorder.
func sessionSettingsWarning(entity string) string {
	return entity + ": the entity requires sessions; retry copies rejoin their session behind later messages (Options.AllowReorder)"
}

// orUnnamed is entity, or a placeholder for a connection that does not name it.
func orUnnamed(entity string) string {
	if entity == "" {
		return "(entity)"
	}
	return entity
}
