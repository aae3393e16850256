package broker

import (
	"fmt"
	"time"

	"github.com/Azure/go-amqp"
)

// duplicateDetector remembers accepted MessageIds for a window, like Service
// Bus duplicate detection: a MessageId seen less than window ago is a
// duplicate. The window counts from the first accepted send; duplicates do
// not extend it. A zero window disables detection.
type duplicateDetector struct {
	window time.Duration
	seen   map[string]dedupRecord
	order  []dedupKey // acceptance order, for pruning oldest first
}

// dedupRecord is what lookup returns for a duplicate: the sequence
// number the original got, and when it was accepted.
type dedupRecord struct {
	seq int64
	at  time.Time
}

// dedupKey is one entry of the pruning order; at tells a stale entry
// (the id was accepted again later) from the current one.
type dedupKey struct {
	id string
	at time.Time
}

func newDuplicateDetector(window time.Duration) duplicateDetector {
	return duplicateDetector{window: window, seen: make(map[string]dedupRecord)}
}

// messageID renders m's MessageId as "type:value" so ids of different AMQP
// types (string, uuid, ulong, binary) never collide; "" means no id.
func messageID(m *amqp.Message) string {
	if m.Properties == nil || m.Properties.MessageID == nil {
		return ""
	}
	id := m.Properties.MessageID
	return fmt.Sprintf("%T:%v", id, id)
}

// lookup reports whether id was accepted within the window, and the sequence
// number it got.
func (d *duplicateDetector) lookup(id string, now time.Time) (int64, bool) {
	if d.window <= 0 || id == "" {
		return 0, false
	}
	r, ok := d.seen[id]
	if !ok || !now.Before(r.at.Add(d.window)) {
		return 0, false
	}
	return r.seq, true
}

// record remembers an accepted id.
func (d *duplicateDetector) record(id string, seq int64, now time.Time) {
	if d.window <= 0 || id == "" {
		return
	}
	d.seen[id] = dedupRecord{seq: seq, at: now}
	d.order = append(d.order, dedupKey{id: id, at: now})
}

// prune forgets records whose window has passed, keeping memory bounded.
func (d *duplicateDetector) prune(now time.Time) {
	for len(d.order) > 0 && !now.Before(d.order[0].at.Add(d.window)) {
		k := d.order[0]
		// Clear the slot so the backing array does not keep the string alive.
		d.order[0] = dedupKey{}
		d.order = d.order[1:]
		if r, ok := d.seen[k.id]; ok && r.at.Equal(k.at) {
			delete(d.seen, k.id)
		}
	}
}
