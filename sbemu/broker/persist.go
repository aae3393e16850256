package broker

import (
	"bytes"
	"cmp"
	"context"
	"encoding/gob"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Persistence ([Options.DataDir]) keeps entities, messages (active,
// locked, scheduled and dead-lettered, with their properties, delivery
// counts and times), sequence counters and duplicate-detection history in a
// directory, so they survive a restart and a crash. Microsoft's emulator
// keeps nothing; with this, a broker crash becomes something a test can
// cause and observe.
//
// Design: a write-ahead journal of resulting states (persist_record.go)
// plus periodic snapshots (journal.go). Every broker method already runs
// under the broker's one mutex; the hooks below only note which messages,
// counters and configurations a call touched, and the unlock at the end of
// the call turns those notes into one record appended to the journal's
// buffer. Appending never waits for the disk, so the hot path stays a
// memory copy and concurrent callers share fsyncs (group commit, see
// journal.go). With persistence off the hooks are a nil check.
//
// Durability is separate from the call: a change is durable once
// [Broker.Sync] returns or the callback of [Broker.AfterSync] runs. The
// AMQP server waits for that before it sends any acknowledgement (the
// accepted disposition of a send, the outcome of a settlement, the reply
// of a management request) and the administration API before it answers,
// so a SIGKILL never loses what a client was told had happened, while the
// server's reader never blocks on the disk. What was not yet acknowledged
// may or may not survive, as on any broker.
//
// Locks are not persisted. After a restart every message that was locked
// is available again, as if its lock had expired at the crash: the
// delivery that held it counts (its delivery count was journaled when it
// was delivered), and a message that used up MaxDeliveryCount goes to the
// dead-letter queue. Service Bus, too, cannot honour a lock across the loss
// of the node holding it; a settle with a lock token from before the
// restart fails with lock-lost, and the message is redelivered.
//
// Reading the directory back (persist_damage.go) cuts off a torn tail,
// the unfinished last record a crash leaves, and refuses other damage
// unless told to truncate. A failed write or fsync stops the journal for
// good (persist_faults.go).
//
// Configuration on reopen: the stored entities (including those created,
// changed or deleted at run time) win; configured entities that are not
// stored (a queue, a topic, or a subscription of a stored topic) are added.
// To start afresh, delete the directory.

// persistence is the broker's journaling state; every field is guarded by
// the broker's mutex except j, which has its own.
type persistence struct {
	j         *journal
	unlockDir func()
	closeOnce sync.Once
	closeErr  error

	// What the running call changed, turned into a record by commit.
	dirty    map[dirtyKey]*entry // messages stored (or just removed) under a sequence number
	seqs     map[*Queue]struct{} // queues whose sequence counter moved
	dedups   []dedupChange       // duplicate-detection records added
	entities bool                // an entity was added, changed or removed
	sessions []sessionChange     // session states set or cleared (session.go)
	rec      recordEncoder       // reused payload buffer
	written  []*entry            // messages the record being built writes in full
}

// dirtyKey names a message slot: a queue and a sequence number.
type dirtyKey struct {
	q   *Queue
	seq int64
}

// dedupChange is one MessageId remembered by duplicate detection.
type dedupChange struct {
	q   *Queue
	id  string
	seq int64
	at  time.Time
}

// sessionChange is one session state as set (nil: cleared).
type sessionChange struct {
	q       *Queue
	id      string
	state   []byte
	updated time.Time
}

// journalSessionState notes that s's state changed; b.mu must be held.
func (q *Queue) journalSessionState(s *sessionState) {
	if p := q.b.persist; p != nil {
		p.sessions = append(p.sessions, sessionChange{q: q, id: s.id, state: s.state, updated: s.stateUpdated})
	}
}

// snapshotChunk is the size at which a snapshot starts a new record, so
// no record needs a huge buffer to check.
const snapshotChunk = 1 << 20

// journalEntry notes that e, stored under seq in q or just removed from
// there, changed; b.mu must be held.
func (q *Queue) journalEntry(seq int64, e *entry) {
	if p := q.b.persist; p != nil {
		p.dirty[dirtyKey{q, seq}] = e
	}
}

// journalSeq notes that q handed out a sequence number.
func (q *Queue) journalSeq() {
	if p := q.b.persist; p != nil {
		p.seqs[q] = struct{}{}
	}
}

// rememberID records an accepted MessageId for duplicate detection, and
// in the journal.
func (q *Queue) rememberID(id string, seq int64, now time.Time) {
	q.dedup.record(id, seq, now)
	if p := q.b.persist; p != nil && q.dedup.window > 0 && id != "" {
		p.dedups = append(p.dedups, dedupChange{q: q, id: id, seq: seq, at: now})
	}
}

// storable refuses, on a persistent broker, an entity configuration the
// journal could not write: a correlation filter's property of a type the
// journal's encoding does not know (an AMQP symbol, a UUID). Accepting it
// would acknowledge a change that the next sync could not make durable,
// and stop the journal. Values of Go's basic types, time.Time and
// time.Duration are storable.
func (b *Broker) storable(cfg any) error {
	if b.persist == nil {
		return nil
	}
	if err := gob.NewEncoder(io.Discard).Encode(cfg); err != nil {
		return fmt.Errorf("%w: a persistent broker cannot store this configuration: %v", ErrInvalidConfig, err)
	}
	return nil
}

// configChanged notes that b.queueCfgs or b.topicCfgs changed.
func (b *Broker) configChanged() {
	if p := b.persist; p != nil {
		p.entities = true
	}
}

// unlock ends a critical section: it appends what the call changed to the
// journal, then releases b.mu. Every method unlocks through it, so no
// change can be left out of the journal.
func (b *Broker) unlock() {
	if b.persist != nil {
		b.persist.commit(b)
	}
	b.mu.Unlock()
}

// commit encodes the noted changes as one record and appends it; b.mu
// must be held. A message is written in full the first time it is stored
// under a sequence number (or when its content changed), afterwards only
// its state and delivery count; a message that came and went within the
// call (a topic's copy before fan-out) is not written at all.
func (p *persistence) commit(b *Broker) {
	if len(p.dirty) == 0 && len(p.seqs) == 0 && len(p.dedups) == 0 && len(p.sessions) == 0 && !p.entities {
		return
	}
	r := &p.rec
	r.buf = r.buf[:0]
	err := p.encodeChanges(b, r)
	if err != nil {
		clear(p.written)
		p.written = p.written[:0]
	}
	clear(p.dirty)
	clear(p.seqs)
	clear(p.dedups)
	p.dedups = p.dedups[:0]
	clear(p.sessions)
	p.sessions = p.sessions[:0]
	p.entities = false
	if err != nil {
		// Only an entity configuration gob cannot encode gets here (a
		// correlation filter value handed to the broker directly); the
		// journal can no longer describe the state, so it stops and every
		// later sync fails.
		p.j.fail(err)
		return
	}
	end := p.j.appendRecord(r.buf)
	for _, e := range p.written {
		e.storedAt = end
	}
	clear(p.written)
	p.written = p.written[:0]
	if p.j.wantSnapshot() {
		data, err := b.encodeSnapshot()
		if err != nil {
			p.j.fail(err)
			return
		}
		p.j.requestSnapshot(data)
	}
}

// encodeChanges writes the noted changes: configuration first, removals
// before stores (a renumbered scheduled message leaves one slot and takes
// another in the same call).
func (p *persistence) encodeChanges(b *Broker, r *recordEncoder) error {
	if p.entities {
		if err := r.entities(storedEntities{Queues: b.queueCfgs, Topics: b.topicCfgs}); err != nil {
			return err
		}
	}
	for q := range p.seqs {
		if !q.removed {
			r.lastSeq(q.name, q.lastSeq)
		}
	}
	for k, e := range p.dirty {
		if k.q.removed || k.q.storedAs(k.seq, e) {
			continue
		}
		if e.journaledAt == k.seq {
			r.delete(k.q.name, k.seq)
			e.journaledAt = 0
		}
	}
	for k, e := range p.dirty {
		if k.q.removed || !k.q.storedAs(k.seq, e) {
			continue
		}
		if e.journaledAt == k.seq && !e.msgChanged {
			r.meta(k.q.name, k.seq, e)
			continue
		}
		r.put(k.q.name, k.seq, e)
		e.journaledAt, e.msgChanged = k.seq, false
		p.written = append(p.written, e)
	}
	for _, d := range p.dedups {
		if !d.q.removed {
			r.dedup(d.q.name, d.id, d.seq, d.at)
		}
	}
	for _, c := range p.sessions {
		if !c.q.removed {
			r.sessionState(c.q.name, c.id, c.state, c.updated)
		}
	}
	return nil
}

// encodeSnapshot encodes the whole durable state as framed records ending
// in opEnd; b.mu must be held.
func (b *Broker) encodeSnapshot() ([]byte, error) {
	size := 0
	for _, q := range b.allQueues() {
		for e := range q.order.entries() {
			size += e.size + 64
		}
	}
	r := &recordEncoder{buf: make([]byte, 0, size+4096)}
	start := r.beginRecord()
	if err := r.entities(storedEntities{Queues: b.queueCfgs, Topics: b.topicCfgs}); err != nil {
		return nil, err
	}
	for _, q := range b.allQueues() {
		r.lastSeq(q.name, q.lastSeq)
		for e := range q.order.entries() {
			seq := e.seq
			r.put(q.name, seq, e)
			e.journaledAt, e.msgChanged = seq, false
			if len(r.buf)-start >= snapshotChunk {
				r.endRecord(start)
				start = r.beginRecord()
			}
		}
		for id, rec := range q.dedup.seen {
			r.dedup(q.name, id, rec.seq, rec.at)
		}
		for id, ss := range q.sessions {
			if ss.state != nil {
				r.sessionState(q.name, id, ss.state, ss.stateUpdated)
			}
		}
	}
	r.byte(opEnd)
	r.endRecord(start)
	return r.buf, nil
}

// openPersistent is [New] with a data directory: it loads the stored
// state, builds the broker from it and the configuration, and starts a new
// journal generation with a fresh snapshot, which also cuts off a torn
// tail of the old log (or, with TruncateDamagedJournal, the damage).
func openPersistent(opts Options, queues []QueueConfig) (*Broker, error) {
	dir := opts.DataDir
	if opts.CompactAfter < 0 {
		return nil, fmt.Errorf("%w: negative CompactAfter %d", ErrInvalidConfig, opts.CompactAfter)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, persistErr("creating data directory", err)
	}
	unlockDir, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	b, err := openLocked(opts, queues)
	if err != nil {
		unlockDir()
		return nil, fmt.Errorf("broker: data directory %s: %w", dir, err)
	}
	b.persist.unlockDir = unlockDir
	return b, nil
}

// openLocked does the work of openPersistent once the directory is locked.
//
// A start serves as soon as it has replayed the directory: when the
// directory is a snapshot and the one log after it, as every clean stop,
// crash and compaction leaves it, the broker goes on appending to that
// log (its torn tail, if any, cut off first) and leaves compaction to the
// journal, which snapshots once the log has grown as usual. Writing and
// fsyncing a whole snapshot before serving is what made a start with 1M
// messages take 10–15 s (issue 31). Any other layout (no snapshot yet,
// several logs, a truncated damaged journal) is rare, and starts the old
// way: a new generation whose snapshot is written before serving.
func openLocked(opts Options, queues []QueueConfig) (*Broker, error) {
	dir := opts.DataDir
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	img, gen, damage, err := loadImage(dir, nil)
	if err != nil {
		return nil, err
	}
	img, damaged, err := handleDamage(opts, log, img, damage)
	if err != nil {
		return nil, err
	}
	topics := opts.Topics
	if img.haveEntities {
		queues, topics = mergeEntities(img.entities, queues, topics)
	}
	inner := opts
	inner.DataDir, inner.Topics = "", topics
	b, err := New(inner, queues...)
	if err != nil {
		return nil, err
	}
	compactAfter := opts.CompactAfter
	if compactAfter == 0 {
		compactAfter = DefaultCompactAfter
	}
	resume, ok := resumableLog(img, damage, damaged)
	locked, err := b.restore(img)
	if err != nil {
		b.Close()
		return nil, err
	}
	if ok {
		f, size, err := reopenLog(dir, resume, damage)
		if err != nil {
			b.Close()
			return nil, err
		}
		removeStaleFiles(dir, resume.gen, nil)
		b.mu.Lock()
		b.persist = newPersistence(newJournal(dir, f, journalState{
			gen: resume.gen, compactAfter: compactAfter, lastSnap: img.snapshotSize, size: size,
		}, log))
		// The locks end now, as changes of this run: journaled like any
		// other, in the log being continued.
		b.returnRestoredLocks(locked)
		b.unlock()
		return b, nil
	}
	b.mu.Lock()
	b.returnRestoredLocks(locked)
	b.mu.Unlock()
	gen++
	f, err := createJournalFile(dir, gen)
	if err != nil {
		b.Close()
		return nil, err
	}
	b.mu.Lock()
	err = b.attachJournal(dir, f, gen, compactAfter, damaged, log)
	b.mu.Unlock()
	if err != nil {
		_ = f.Close()
		b.Close()
		return nil, err
	}
	return b, nil
}

// resumableLog returns the log a start may go on appending to: the one
// log replayed after the snapshot, of the snapshot's generation, when no
// damage other than a torn tail of that log was found.
func resumableLog(img *image, damage *journalDamage, damaged []uint64) (replayedLog, bool) {
	if !img.snapshot || len(img.logs) != 1 || img.logs[0].gen != img.snapshotGen || len(damaged) > 0 {
		return replayedLog{}, false
	}
	if damage != nil && (!damage.torn || damage.gen != img.logs[0].gen || len(damage.later) > 0) {
		return replayedLog{}, false
	}
	return img.logs[0], true
}

// reopenLog opens log for appending, first cutting off its torn tail
// (never acknowledged, see persist_damage.go) durably, so the records
// appended next do not follow damage. It returns the file and its size.
func reopenLog(dir string, log replayedLog, damage *journalDamage) (*os.File, int64, error) {
	path := filepath.Join(dir, journalName(log.gen))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, 0, persistErr("opening journal "+path, err)
	}
	size := log.size
	if damage != nil {
		size = damage.Offset
		err = f.Truncate(size)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			_ = f.Close()
			return nil, 0, persistErr("cutting the torn tail of journal "+path, err)
		}
	}
	return f, size, nil
}

// attachJournal writes the snapshot of generation gen and makes f, that
// generation's empty log, the broker's journal; b.mu must be held, so the
// snapshot is exactly the state the new log continues from. The logs of
// the generations in damaged, which a truncation cut short, are kept
// aside rather than deleted.
func (b *Broker) attachJournal(dir string, f *os.File, gen uint64, compactAfter int64, damaged []uint64, log *slog.Logger) error {
	snap, err := b.encodeSnapshot()
	if err != nil {
		return err
	}
	if err := writeSnapshot(dir, gen, snap); err != nil {
		return err
	}
	removeStaleFiles(dir, gen, damaged)
	b.persist = newPersistence(newJournal(dir, f, journalState{
		gen: gen, compactAfter: compactAfter, lastSnap: int64(len(snap)), snapshotWritten: true,
	}, log))
	return nil
}

func newPersistence(j *journal) *persistence {
	return &persistence{j: j, dirty: map[dirtyKey]*entry{}, seqs: map[*Queue]struct{}{}}
}

// journalGenerations lists the generations of the logs in dir, ascending.
func journalGenerations(dir string) ([]uint64, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, persistErr("listing data directory", err)
	}
	var gens []uint64
	for _, de := range des {
		s, ok := strings.CutPrefix(de.Name(), "journal-")
		if !ok {
			continue
		}
		if g, err := strconv.ParseUint(s, 10, 64); err == nil {
			gens = append(gens, g)
		}
	}
	slices.Sort(gens)
	return gens, nil
}

// removeStaleFiles deletes the logs older than generation gen, which its
// snapshot covers, and a leftover temporary snapshot; the logs of the
// generations in damaged are renamed to <name>.damaged instead. Failures
// only leave files that the next start deletes again.
func removeStaleFiles(dir string, gen uint64, damaged []uint64) {
	gens, _ := journalGenerations(dir)
	for _, g := range gens {
		if g >= gen {
			continue
		}
		path := filepath.Join(dir, journalName(g))
		if slices.Contains(damaged, g) {
			_ = os.Rename(path, path+damagedSuffix)
			continue
		}
		_ = os.Remove(path)
	}
	_ = os.Remove(filepath.Join(dir, snapshotTemp))
}

// mergeEntities adds the configured entities that are not stored to the
// stored ones; a stored entity keeps its stored settings.
func mergeEntities(stored storedEntities, queues []QueueConfig, topics []TopicConfig) ([]QueueConfig, []TopicConfig) {
	qs := slices.Clone(stored.Queues)
	ts := make([]TopicConfig, len(stored.Topics))
	for i, t := range stored.Topics {
		ts[i] = cloneTopicConfig(t)
	}
	taken := map[string]bool{}
	for _, q := range qs {
		taken[strings.ToLower(q.Name)] = true
	}
	for _, t := range ts {
		taken[strings.ToLower(t.Name)] = true
	}
	for _, q := range queues {
		if !taken[strings.ToLower(q.Name)] {
			qs = append(qs, q)
			taken[strings.ToLower(q.Name)] = true
		}
	}
	for _, t := range topics {
		i := slices.IndexFunc(ts, func(s TopicConfig) bool { return strings.EqualFold(s.Name, t.Name) })
		switch {
		case i >= 0:
			for _, sc := range t.Subscriptions {
				if subscriptionIndex(ts[i], sc.Name) < 0 {
					ts[i].Subscriptions = append(ts[i].Subscriptions, sc)
				}
			}
		case !taken[strings.ToLower(t.Name)]:
			ts = append(ts, t)
			taken[strings.ToLower(t.Name)] = true
		}
	}
	return qs, ts
}

// storedQueue finds the queue a stored path names, dead-letter queues
// included; b.mu must be held.
func (b *Broker) storedQueue(key string) *Queue {
	if base, ok := strings.CutSuffix(key, strings.ToLower(DeadLetterSuffix)); ok {
		if q := b.queues[base]; q != nil {
			return q.dlq
		}
		return nil
	}
	return b.queues[key]
}

// restore installs the stored messages, counters and duplicate-detection
// records into the freshly built broker, and returns the messages that
// were locked, for [Broker.returnRestoredLocks].
func (b *Broker) restore(img *image) ([]restoredLock, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	keys := make([]string, 0, len(img.stored))
	for k := range img.stored {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	// Every counter first: returning a lock may dead-letter, which
	// numbers the message in a dead-letter queue not restored yet.
	for _, k := range keys {
		q := b.storedQueue(k)
		if q == nil {
			return nil, fmt.Errorf("%w: state for unknown entity %q", ErrDamaged, img.stored[k].path)
		}
		q.lastSeq = max(q.lastSeq, img.stored[k].lastSeq)
	}
	var locked []restoredLock
	for _, k := range keys {
		s, q := img.stored[k], b.storedQueue(k)
		// One pass over the map into a slice sorted by number: with 1M
		// messages, looking each number up again after sorting the keys
		// cost about 0.5 s of a restart's CPU.
		msgs := make([]seqMessage, 0, len(s.msgs))
		for seq, m := range s.msgs {
			msgs = append(msgs, seqMessage{seq, m})
		}
		slices.SortFunc(msgs, func(a, b seqMessage) int { return cmp.Compare(a.seq, b.seq) })
		for _, sm := range msgs {
			seq := sm.seq
			e, err := restoreEntry(sm.m, seq, s.path)
			if err != nil {
				return nil, err
			}
			// On disk in full under seq: later changes journal its state
			// only, and its removal as a delete.
			e.journaledAt = seq
			q.storeEntry(e)
			switch e.state {
			case stateScheduled:
				q.timeline.setDeadline(e, e.deadline) // its scheduledAt, set by restoreEntry
			case stateAvailable:
				q.makeAvailable(e)
			case stateLocked:
				locked = append(locked, restoredLock{q, e})
			case stateDeferred:
				e.deferred = true
				q.deferredCount++
			}
		}
		for id, ss := range s.sessions {
			if q.sessionful() {
				restored := q.session(id)
				restored.state, restored.stateUpdated = ss.state, ss.updated
			}
		}
		if q.dedup.window > 0 {
			recs := make([]dedupKey, 0, len(s.dedup))
			for id, r := range s.dedup {
				q.dedup.seen[id] = r
				recs = append(recs, dedupKey{id: id, at: r.at})
			}
			slices.SortFunc(recs, func(a, b dedupKey) int { return a.at.Compare(b.at) })
			q.dedup.order = recs
		}
	}
	return locked, nil
}

// seqMessage is a stored message and its sequence number.
type seqMessage struct {
	seq int64
	m   *storedMessage
}

// restoredLock is a message that was locked when the directory was
// written, and a queue it is in.
type restoredLock struct {
	q *Queue
	e *entry
}

// returnRestoredLocks returns the messages that were locked, as if their
// locks had expired now, and arms the timers; b.mu must be held.
func (b *Broker) returnRestoredLocks(locked []restoredLock) {
	now := b.clock.Now()
	for _, l := range locked {
		l.q.returnLocked(l.e, true, now)
	}
	b.armAll(now)
}

// restoreEntry makes an entry of one stored message, which replay checked
// (persist_record.go). The message's bytes are copied out of the buffer
// replay read, which would otherwise stay in memory as long as any
// message of the file does.
func restoreEntry(m *storedMessage, seq int64, path string) (*entry, error) {
	if err := checkState(m.state, seq, path); err != nil {
		return nil, err
	}
	e := newEntry(bytes.Clone(m.msg), m.session, m.size)
	e.seq = seq
	e.state = m.state
	e.deliveryCount = m.deliveryCount
	e.enqueuedAt, e.expiresAt, e.expiryCap = m.enqueuedAt, m.expiresAt, m.expiryCap
	if e.state == stateScheduled {
		e.deadline = m.scheduledAt // see entry.scheduledAt
	}
	return e, nil
}

// closePersistence flushes and closes the journal and releases the
// directory; it runs once, after the broker stopped changing.
func (b *Broker) closePersistence() error {
	p := b.persist
	if p == nil {
		return nil
	}
	p.closeOnce.Do(func() {
		p.closeErr = p.j.close()
		if p.unlockDir != nil {
			p.unlockDir()
		}
	})
	return p.closeErr
}

// Persistent reports whether the broker keeps its state in
// [Options.DataDir].
func (b *Broker) Persistent() bool { return b.persist != nil }

// Sync waits until every change made before the call is on disk, ctx is
// done, or the journal failed; it returns at once without
// [Options.DataDir]. After [Broker.Close] it reports how the final flush
// went.
func (b *Broker) Sync(ctx context.Context) error {
	if b.persist == nil {
		return nil
	}
	done := make(chan error, 1)
	b.persist.j.afterSync(func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AfterSync calls fn once every change made before the call is on disk,
// with nil, or with the error that stopped the journal (wrapping
// [ErrPersistence]). Without [Options.DataDir], or when nothing is
// waiting to be written, fn runs at once on the caller's goroutine;
// otherwise on the journal's goroutine, in call order, so fn must not
// block. The AMQP server sends its acknowledgements from fn, which lets
// its reader go on while the disk works.
func (b *Broker) AfterSync(fn func(error)) {
	if b.persist == nil {
		fn(nil)
		return
	}
	b.persist.j.afterSync(fn)
}

// storedPosition is what [Delivery] carries for e: the journal position
// to wait for before the message may leave the broker, 0 for nothing to
// wait for, -1 for the record of the running call (e was written in full
// by it, say a scheduled message activated by this very receive). b.mu must
// be held.
func (q *Queue) storedPosition(e *entry) int64 {
	if q.b.persist == nil {
		return 0
	}
	if e.journaledAt != e.seq || e.msgChanged {
		return -1
	}
	return e.storedAt
}

// WaitStored blocks until the message of d, obtained from [Queue.Receive]
// or [Queue.TryReceive], is on disk, ctx is done or the journal failed.
// The AMQP server calls it before it transfers a message, so a client
// never processes a message that a crash could make disappear (and whose
// sequence number a crash could hand out again). It returns at once
// without [Options.DataDir] and when the message was stored earlier, the
// usual case; only a message received right after it was sent waits for
// the fsync of its send. Once the journal stopped ([Broker.JournalFailed])
// it returns the journal's error for every delivery.
func (b *Broker) WaitStored(ctx context.Context, d *Delivery) error {
	if b.persist == nil {
		return nil
	}
	if d.storedAt == 0 {
		// Stored before the journal started (restored at open): nothing to
		// wait for, but a broker whose journal stopped transfers nothing.
		return b.persist.j.failure()
	}
	done := make(chan error, 1)
	b.persist.j.afterPosition(d.storedAt, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// JournalStats returns the journal's counters; zero without
// [Options.DataDir].
func (b *Broker) JournalStats() JournalStats {
	if b.persist == nil {
		return JournalStats{}
	}
	return b.persist.j.statsNow()
}
