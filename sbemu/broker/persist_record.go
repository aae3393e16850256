package broker

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"fmt"
	"hash/crc32"
	"strings"
	"time"
)

// The payload of a journal or snapshot record is a sequence of operations,
// each an opcode byte followed by its fields (varints, length-prefixed
// strings and bytes). One record holds every change of one broker call, so
// a crash applies a call entirely or not at all: a dead-lettering never
// leaves the message in both queues, a fan-out never reaches half the
// subscriptions.
//
// The operations describe resulting state, not the calls that produced it:
// "message 7 of orders is now available with delivery count 2" rather
// than "abandon". Replay is then a plain overwrite that needs neither the
// clock nor the rules, and every path that changes a message (receive,
// settle, expiry, scheduled activation, fan-out, forwarding, dead-lettering
// on MaxDeliveryCount) is covered by the same few hooks.
const (
	// opEntities: every entity's configuration (gob of storedEntities).
	opEntities byte = iota + 1
	// opLastSeq: path, the highest sequence number handed out.
	opLastSeq
	// opPut: path, seq, state, delivery count, size, four times, message.
	opPut
	// opMeta: path, seq, state, delivery count (the message is unchanged).
	opMeta
	// opDelete: path, seq.
	opDelete
	// opDedup: path, MessageId key, seq, acceptance time.
	opDedup
	// opEnd: the last operation of a snapshot, proving it complete.
	opEnd
	// opSessionState: path, session id, presence byte (0 cleared, 1 set),
	// state bytes when set. New with sessions: files without sessions
	// never contain it and load as before; a broker from before sessions
	// refuses a file that does, as an unknown operation.
	opSessionState
	// opSessionStateAt: as opSessionState, then (when set) the time the
	// state was set, which get-message-sessions filters on. It replaces
	// opSessionState in what the broker writes; files holding the older
	// operation still load, their states dated zero.
	opSessionStateAt
)

// storedEntities is what opEntities carries: the broker's configurations
// as created or last updated (zero fields still mean defaults).
type storedEntities struct {
	Queues []QueueConfig
	Topics []TopicConfig
}

func init() {
	// CorrelationFilter.Properties holds values of any type; gob needs the
	// concrete types that can appear there beyond its built-in ones.
	gob.Register(time.Time{})
	gob.Register(time.Duration(0))
}

// recordEncoder builds one payload.
type recordEncoder struct {
	buf []byte
}

func (r *recordEncoder) byte(v byte)      { r.buf = append(r.buf, v) }
func (r *recordEncoder) uvarint(v uint64) { r.buf = binary.AppendUvarint(r.buf, v) }
func (r *recordEncoder) varint(v int64)   { r.buf = binary.AppendVarint(r.buf, v) }
func (r *recordEncoder) bytes(v []byte) {
	r.uvarint(uint64(len(v)))
	r.buf = append(r.buf, v...)
}
func (r *recordEncoder) string(v string) {
	r.uvarint(uint64(len(v)))
	r.buf = append(r.buf, v...)
}

// time encodes the zero time distinctly from the Unix epoch, which a fake
// clock may well start at.
func (r *recordEncoder) time(t time.Time) {
	if t.IsZero() {
		r.byte(0)
		return
	}
	r.byte(1)
	r.varint(t.UnixNano())
}

func (r *recordEncoder) entities(cfg storedEntities) error {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(cfg); err != nil {
		return fmt.Errorf("%w: encoding entity configuration: %w", ErrPersistence, err)
	}
	r.byte(opEntities)
	r.bytes(b.Bytes())
	return nil
}

func (r *recordEncoder) lastSeq(path string, seq int64) {
	r.byte(opLastSeq)
	r.string(path)
	r.varint(seq)
}

// put records e in full at sequence number seq of path: its state and
// its message as stored, already encoded (encoded.go).
func (r *recordEncoder) put(path string, seq int64, e *entry) {
	r.byte(opPut)
	r.string(path)
	r.varint(seq)
	r.byte(byte(e.storedState()))
	r.uvarint(uint64(e.deliveryCount))
	r.uvarint(uint64(e.size))
	r.time(e.enqueuedAt)
	r.time(e.scheduledAt())
	r.time(e.expiresAt)
	r.time(e.expiryCap)
	r.bytes(e.data)
}

// beginRecord starts a framed record in place: room for the header now,
// filled in by endRecord, so a large snapshot is never copied.
func (r *recordEncoder) beginRecord() int {
	start := len(r.buf)
	r.buf = append(r.buf, make([]byte, recordHeaderSize)...)
	return start
}

// endRecord fills in the header of the record begun at start.
func (r *recordEncoder) endRecord(start int) {
	putRecordHeader(r.buf[start:start+recordHeaderSize], r.buf[start+recordHeaderSize:])
}

func (r *recordEncoder) meta(path string, seq int64, e *entry) {
	r.byte(opMeta)
	r.string(path)
	r.varint(seq)
	r.byte(byte(e.storedState()))
	r.uvarint(uint64(e.deliveryCount))
}

func (r *recordEncoder) delete(path string, seq int64) {
	r.byte(opDelete)
	r.string(path)
	r.varint(seq)
}

func (r *recordEncoder) dedup(path, id string, seq int64, at time.Time) {
	r.byte(opDedup)
	r.string(path)
	r.string(id)
	r.varint(seq)
	r.time(at)
}

// storedState is the state the journal records for e. A deferred message
// is recorded as deferred even while a receive by sequence number holds its
// lock: locks do not survive a restart, and that lock would return it to
// the deferred messages anyway. stateDeferred (4) is new in this journal
// format; files written before it never contain it, so they still load,
// while a broker from before it refuses a file that does (as damage).
func (e *entry) storedState() entryState {
	if e.deferred {
		return stateDeferred
	}
	return e.state
}

func (r *recordEncoder) sessionState(path, id string, state []byte, updated time.Time) {
	r.byte(opSessionStateAt)
	r.string(path)
	r.string(id)
	if state == nil {
		r.byte(0)
		return
	}
	r.byte(1)
	r.bytes(state)
	r.time(updated)
}

// recordDecoder reads one payload; the first error sticks and every later
// read returns zero values.
type recordDecoder struct {
	buf []byte
	err error
}

func (d *recordDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated %s", ErrDamaged, what)
	}
	d.buf = nil
}

func (d *recordDecoder) byte() byte {
	if len(d.buf) == 0 {
		d.fail("byte")
		return 0
	}
	v := d.buf[0]
	d.buf = d.buf[1:]
	return v
}

func (d *recordDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *recordDecoder) varint() int64 {
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *recordDecoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.buf)) {
		d.fail("bytes")
		return nil
	}
	v := d.buf[:n:n]
	d.buf = d.buf[n:]
	return v
}

func (d *recordDecoder) string() string { return string(d.bytes()) }

func (d *recordDecoder) time() time.Time {
	switch d.byte() {
	case 0:
		return time.Time{}
	case 1:
		return time.Unix(0, d.varint())
	}
	d.fail("time")
	return time.Time{}
}

// storedMessage is one message as the journal describes it.
type storedMessage struct {
	state         entryState
	deliveryCount uint32
	size          int
	enqueuedAt    time.Time
	scheduledAt   time.Time
	expiresAt     time.Time
	expiryCap     time.Time
	msg           []byte // the encoded message, in the buffer replay read
	session       string // its session id, read at replay (checkStored)
}

// checkState refuses a stored state that no message can be in.
func checkState(state entryState, seq int64, path string) error {
	switch state {
	case stateScheduled, stateAvailable, stateLocked, stateDeferred:
		return nil
	}
	return fmt.Errorf("%w: message %d of %q in state %d", ErrDamaged, seq, path, state)
}

// storedEntity is the durable state of one queue, topic, subscription or
// dead-letter queue.
type storedEntity struct {
	path    string // as configured
	lastSeq int64
	msgs    map[int64]*storedMessage
	dedup   map[string]dedupRecord
	// sessions holds the session states that are set.
	sessions map[string]storedSessionState
}

// storedSessionState is one session state and when it was set.
type storedSessionState struct {
	state   []byte
	updated time.Time
}

// image is the durable state as replay rebuilds it, before it becomes a
// broker again.
type image struct {
	haveEntities bool
	entities     storedEntities
	valid        map[string]bool // lower-case paths of every entity, dead-letter queues included
	stored       map[string]*storedEntity
	complete     bool // an opEnd was applied (snapshots only)

	// What loadImage replayed: the snapshot (if any) and the logs after
	// it, which decide whether a start may go on appending to the last
	// log (persist.go, resumableLog).
	snapshot     bool
	snapshotGen  uint64
	snapshotSize int64
	logs         []replayedLog
}

// replayedLog is one log file replayed after the snapshot.
type replayedLog struct {
	gen  uint64
	size int64 // bytes read, header included
}

func newImage() *image {
	return &image{stored: map[string]*storedEntity{}}
}

// entity returns the state of path, creating it; the path must name an
// entity of the last opEntities.
func (img *image) entity(path string) (*storedEntity, error) {
	key := strings.ToLower(path)
	if !img.valid[key] {
		return nil, fmt.Errorf("%w: record for unknown entity %q", ErrDamaged, path)
	}
	s, ok := img.stored[key]
	if !ok {
		s = &storedEntity{path: path, msgs: map[int64]*storedMessage{}, dedup: map[string]dedupRecord{}, sessions: map[string]storedSessionState{}}
		img.stored[key] = s
	}
	return s, nil
}

// setEntities installs a configuration and forgets the state of every
// entity it no longer has, as removing the entity did.
func (img *image) setEntities(cfg storedEntities) {
	img.haveEntities = true
	img.entities = cfg
	img.valid = map[string]bool{}
	add := func(path string) {
		img.valid[strings.ToLower(path)] = true
		img.valid[strings.ToLower(path+DeadLetterSuffix)] = true
	}
	for _, q := range cfg.Queues {
		add(q.Name)
	}
	for _, t := range cfg.Topics {
		add(t.Name)
		for _, s := range t.Subscriptions {
			add(SubscriptionPath(t.Name, s.Name))
		}
	}
	for key := range img.stored {
		if !img.valid[key] {
			delete(img.stored, key)
		}
	}
}

// apply replays one record payload.
func (img *image) apply(payload []byte) error {
	d := &recordDecoder{buf: payload}
	for len(d.buf) > 0 && d.err == nil {
		if err := img.applyOp(d); err != nil {
			return err
		}
	}
	return d.err
}

// applyOp replays one operation.
func (img *image) applyOp(d *recordDecoder) error {
	op := d.byte()
	if op == opEntities {
		var cfg storedEntities
		raw := d.bytes()
		if d.err != nil {
			return d.err
		}
		if err := gob.NewDecoder(bytes.NewReader(raw)).Decode(&cfg); err != nil {
			return fmt.Errorf("%w: entity configuration: %v", ErrDamaged, err)
		}
		img.setEntities(cfg)
		return nil
	}
	if op == opEnd {
		img.complete = true
		return nil
	}
	path := d.string()
	if d.err != nil {
		return d.err
	}
	s, err := img.entity(path)
	if err != nil {
		return err
	}
	switch op {
	case opLastSeq:
		s.lastSeq = max(s.lastSeq, d.varint())
	case opPut:
		seq := d.varint()
		m := &storedMessage{
			state:         entryState(d.byte()),
			deliveryCount: uint32(d.uvarint()),
			size:          int(d.uvarint()),
			enqueuedAt:    d.time(),
			scheduledAt:   d.time(),
			expiresAt:     d.time(),
			expiryCap:     d.time(),
			msg:           d.bytes(),
		}
		if d.err != nil {
			return d.err
		}
		// Checked now, not when the broker is rebuilt, so that a message
		// that does not decode is reported at its record (file and
		// offset), which a truncation can cut.
		session, err := checkStored(m.msg)
		if err != nil {
			return fmt.Errorf("%w: message %d of %q: %v", ErrDamaged, seq, path, err)
		}
		m.session = session
		if err := checkState(m.state, seq, path); err != nil {
			return err
		}
		s.msgs[seq] = m
		s.lastSeq = max(s.lastSeq, seq)
	case opMeta:
		seq := d.varint()
		state, count := entryState(d.byte()), uint32(d.uvarint())
		if d.err != nil {
			return d.err
		}
		m, ok := s.msgs[seq]
		if !ok {
			return fmt.Errorf("%w: update of unknown message %d of %q", ErrDamaged, seq, path)
		}
		if err := checkState(state, seq, path); err != nil {
			return err
		}
		m.state, m.deliveryCount = state, count
	case opDelete:
		delete(s.msgs, d.varint())
	case opDedup:
		id, seq, at := d.string(), d.varint(), d.time()
		s.dedup[id] = dedupRecord{seq: seq, at: at}
	case opSessionState, opSessionStateAt:
		id := d.string()
		switch d.byte() {
		case 0:
			delete(s.sessions, id)
		case 1:
			ss := storedSessionState{state: append([]byte{}, d.bytes()...)}
			if op == opSessionStateAt {
				ss.updated = d.time()
			}
			s.sessions[id] = ss
		default:
			d.fail("session state")
		}
	default:
		return fmt.Errorf("%w: unknown operation %d", ErrDamaged, op)
	}
	return d.err
}

// frameFault says why readFrame found no intact record.
type frameFault int

const (
	frameOK frameFault = iota
	// frameIncomplete: the data ends inside the record, before the end of
	// its header or of the payload an intact header announces.
	frameIncomplete
	// frameBadHeader: the header fails its own checksum, so its length
	// cannot be trusted and the record's end is unknown.
	frameBadHeader
	// frameTooLarge: an intact header announcing more than any record can
	// hold.
	frameTooLarge
	// frameBadPayload: an intact header whose payload fails its checksum.
	frameBadPayload
)

// String is the fault as an error message says it.
func (f frameFault) String() string {
	switch f {
	case frameIncomplete:
		return "the record is incomplete"
	case frameBadHeader:
		return "the record header fails its checksum"
	case frameTooLarge:
		return "the record header announces an impossible length"
	case frameBadPayload:
		return "the record fails its checksum"
	}
	return "intact record"
}

// readFrame splits the first framed record off data: its payload and its
// size, header included. size is also set for frameBadPayload, whose
// header (and so whose end) is intact.
func readFrame(data []byte) (payload []byte, size int, fault frameFault) {
	if len(data) < recordHeaderSize {
		return nil, 0, frameIncomplete
	}
	if crc32.Checksum(data[:8], castagnoli) != binary.LittleEndian.Uint32(data[8:]) {
		return nil, 0, frameBadHeader
	}
	n := binary.LittleEndian.Uint32(data)
	if n > maxRecordSize {
		return nil, 0, frameTooLarge
	}
	size = recordHeaderSize + int(n)
	if len(data) < size {
		return nil, 0, frameIncomplete
	}
	payload = data[recordHeaderSize:size]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(data[4:]) {
		return nil, size, frameBadPayload
	}
	return payload, size, frameOK
}
