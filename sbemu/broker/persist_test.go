package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// persistStart is the fake time every persistence test starts at.
var persistStart = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// persistQueues and persistTopics cover every kind of entity: a queue with
// duplicate detection and TTL, a forwarding queue, a topic whose
// subscriptions have a SQL rule with an action and a correlation rule.
var (
	persistQueues = []QueueConfig{
		{Name: "orders", DuplicateDetectionWindow: time.Hour, MaxDeliveryCount: 3, DefaultTTL: 24 * time.Hour},
		{Name: "inbox", ForwardTo: "orders"},
	}
	persistTopics = []TopicConfig{{
		Name: "events", DuplicateDetectionWindow: time.Hour,
		Subscriptions: []SubscriptionConfig{
			{Name: "urgent", Rules: []RuleConfig{{Name: "hot", SQLFilter: "priority > 2", SQLAction: "SET tagged = 'yes'"}}},
			{Name: "eu", Rules: []RuleConfig{{Name: "region", CorrelationFilter: &CorrelationFilter{Properties: map[string]any{"region": "eu", "tier": int64(2)}}}}},
		},
	}}
)

// openPersistBroker opens a broker on dir with the persistence test
// configuration; it is closed at test end (again, harmlessly, if the test
// closed it).
func openPersistBroker(t *testing.T, dir string, mock *clock.Mock, opts Options) *Broker {
	t.Helper()
	opts.Clock, opts.DataDir = mock, dir
	if opts.Topics == nil {
		opts.Topics = persistTopics
	}
	b, err := New(opts, persistQueues...)
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return b
}

func newPersistClock() *clock.Mock {
	mock := clock.NewMock()
	mock.Set(persistStart)
	return mock
}

// storedMsg is what a test compares of one message before and after a
// restart: everything the journal must keep.
type storedMsg struct {
	Seq           int64
	Body          string
	ID            any
	DeliveryCount uint32
	Props         map[string]any
	EnqueuedMs    int64
	Scheduled     bool
	DLSource      any
}

// dumpState peeks every entity, dead-letter queues included.
func dumpState(t *testing.T, b *Broker) map[string][]storedMsg {
	t.Helper()
	paths := b.Queues()
	for _, topic := range b.Topics() {
		paths = append(paths, topic)
		tq, _ := b.Queue(topic)
		paths = append(paths, tq.Subscriptions()...)
	}
	out := map[string][]storedMsg{}
	for _, p := range paths {
		for _, name := range []string{p, p + DeadLetterSuffix} {
			q, ok := b.Queue(name)
			if !ok {
				continue
			}
			var msgs []storedMsg
			for _, d := range q.Peek(1, 1000) {
				m := d.Message
				sm := storedMsg{Seq: d.SequenceNumber, Body: string(m.GetData()), ID: m.Properties.MessageID,
					DeliveryCount: m.Header.DeliveryCount, Props: m.ApplicationProperties}
				if v, ok := annotation(m, AnnotationEnqueuedTime); ok {
					sm.EnqueuedMs = v.(time.Time).UnixMilli()
				}
				_, sm.Scheduled = annotation(m, AnnotationMessageState)
				sm.DLSource, _ = annotation(m, AnnotationDeadLetterSource)
				msgs = append(msgs, sm)
			}
			out[name] = msgs
		}
	}
	return out
}

func withAppProps(m *amqp.Message, props map[string]any) *amqp.Message {
	m.ApplicationProperties = props
	return m
}

// TestPersistStateSurvivesReopen builds every kind of durable state,
// closes the broker and opens the directory again: entities with their
// rules (also ones changed at run time), active, locked, abandoned,
// scheduled and dead-lettered messages with their properties, sequence
// counters and duplicate-detection history must all be back.
func TestPersistStateSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	b := openPersistBroker(t, dir, mock, Options{})

	orders, _ := b.Queue("orders")
	inbox, _ := b.Queue("inbox")
	events, _ := b.Queue("events")
	mustSend(t, orders, withAppProps(newMsg("a", "active"), map[string]any{"n": int64(7), "s": "x", "ok": true}))
	mustSend(t, orders, newMsg("b", "abandoned"))
	mustSend(t, orders, newMsg("c", "dead"))
	mustSend(t, orders, newMsg("d", "locked"))
	sched, err := orders.Schedule(newMsg("e", "scheduled"), 100, persistStart.Add(time.Hour))
	require.NoError(t, err)
	mustSend(t, inbox, newMsg("f", "forwarded"))
	mustSend(t, events, withAppProps(newMsg("g", "hot eu"), map[string]any{"priority": int64(5), "region": "eu", "tier": int64(2)}))
	_, err = events.Schedule(newMsg("h", "topic scheduled"), 100, persistStart.Add(2*time.Hour))
	require.NoError(t, err)

	// Receive a, b, c, d in order; settle b, c and leave d locked.
	var ds []*Delivery
	for range 4 {
		ds = append(ds, mustReceive(t, orders, PeekLock))
	}
	require.NoError(t, orders.Release(ds[0].LockToken))
	require.NoError(t, orders.Abandon(ds[1].LockToken, map[any]any{"reason": "retry"}))
	require.NoError(t, orders.DeadLetter(ds[2].LockToken, "Bad", "it was bad", map[string]any{"extra": int64(1)}))

	// Run-time entity changes.
	require.NoError(t, b.AddQueue(QueueConfig{Name: "later", LockDuration: 10 * time.Second}))
	require.NoError(t, b.AddRule("events", "eu", RuleConfig{Name: "all-eu", SQLFilter: "region = 'eu'"}))
	require.NoError(t, b.AddQueue(QueueConfig{Name: "gone"}))
	gone, _ := b.Queue("gone")
	mustSend(t, gone, newMsg("z", "in a deleted queue"))
	require.NoError(t, b.RemoveQueue("gone"))
	later, _ := b.Queue("later")
	mustSend(t, later, newMsg("l", "later"))

	before := dumpState(t, b)
	require.Len(t, before["orders"], 5, "a, b, d, the forwarded f and the scheduled e")
	require.Len(t, before["orders"+DeadLetterSuffix], 1)
	require.Len(t, before[SubscriptionPath("events", "urgent")], 1)
	require.Len(t, before[SubscriptionPath("events", "eu")], 1)
	require.Len(t, before["events"], 1)
	rules, _ := b.Rules("events", "eu")
	lastSeq := before["orders"][len(before["orders"])-1].Seq
	b.Close()

	b2 := openPersistBroker(t, dir, mock, Options{})
	after := dumpState(t, b2)
	assert.Equal(t, before, after)
	assert.Equal(t, []string{"orders", "inbox", "later"}, b2.Queues())
	rules2, _ := b2.Rules("events", "eu")
	assert.Equal(t, rules, rules2)
	cfg, _ := b2.QueueConfig("later")
	assert.Equal(t, 10*time.Second, cfg.LockDuration)
	_, ok := b2.Queue("gone")
	assert.False(t, ok, "a removed queue stays removed")

	orders2, _ := b2.Queue("orders")
	st := orders2.Stats()
	// The scheduled message keeps its activation time (the entry holds it
	// as its timeline deadline, see entry.scheduledAt).
	if sm := orders2.ScheduledMessages(); assert.Len(t, sm, 1) {
		assert.True(t, sm[0].At.Equal(persistStart.Add(time.Hour)), "scheduled at %v", sm[0].At)
	}
	assert.Equal(t, Stats{Active: 4, Scheduled: 1, DeadLettered: 1}, st, "the locked message is available again")
	// Duplicate detection remembers what was accepted before the restart.
	seq, dup, err := orders2.Send(newMsg("a", "again"), 100)
	require.NoError(t, err)
	assert.True(t, dup)
	assert.Equal(t, before["orders"][0].Seq, seq)
	// Sequence numbers continue.
	assert.Greater(t, mustSend(t, orders2, newMsg("new", "new")), max(lastSeq, sched))
	// The abandoned message kept its delivery count and merged property.
	for _, d := range orders2.Peek(1, 10) {
		if string(d.Message.GetData()) == "abandoned" {
			assert.Equal(t, uint32(1), d.Message.Header.DeliveryCount)
			assert.Equal(t, "retry", d.Message.ApplicationProperties["reason"])
		}
	}
	// The scheduled message activates on time, with a new number, and a
	// cancelled one would be gone: cancel the topic's, activate the queue's.
	events2, _ := b2.Queue("events")
	require.NoError(t, events2.CancelScheduled(events2.ScheduledMessages()[0].Seq))
	mock.Add(time.Hour)
	assert.Equal(t, 0, orders2.Stats().Scheduled)
	// New messages still reach subscriptions through the restored rules,
	// including the rule added at run time.
	mustSend(t, events2, withAppProps(newMsg("i", "eu only"), map[string]any{"region": "eu"}))
	eu := mustSubscription(t, b2, "events", "eu")
	assert.Equal(t, 2, eu.Stats().Active)
}

// TestPersistSequenceNumbersNeverRepeat: numbers of messages that left
// the entity (completed, or fanned out of a topic at once) are not handed
// out again after a restart.
func TestPersistSequenceNumbersNeverRepeat(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	b := openPersistBroker(t, dir, mock, Options{})
	orders, _ := b.Queue("orders")
	events, _ := b.Queue("events")
	var last int64
	for i := range 3 {
		last = mustSend(t, orders, newMsg(fmt.Sprint(i), "x"))
		mustSend(t, events, newMsg(fmt.Sprint(i), "x"))
		require.NoError(t, orders.Complete(mustReceive(t, orders, PeekLock).LockToken))
	}
	b.Close()

	b2 := openPersistBroker(t, dir, mock, Options{})
	orders2, _ := b2.Queue("orders")
	events2, _ := b2.Queue("events")
	assert.Equal(t, last+1, mustSend(t, orders2, newMsg("next", "x")))
	seq, err := events2.Schedule(newMsg("next", "x"), 10, persistStart.Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, int64(4), seq, "the topic numbered three messages before")
}

// TestPersistLockedMessagesReturnOnReopen: a message locked at the crash
// counts that delivery, and one that used up MaxDeliveryCount is
// dead-lettered when the broker comes back.
func TestPersistLockedMessagesReturnOnReopen(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	b := openPersistBroker(t, dir, mock, Options{})
	orders, _ := b.Queue("orders")
	mustSend(t, orders, newMsg("x", "last chance"))
	mustSend(t, orders, newMsg("y", "first try"))
	d := mustReceive(t, orders, PeekLock)
	require.NoError(t, orders.Abandon(d.LockToken, nil))
	d = mustReceive(t, orders, PeekLock)
	require.NoError(t, orders.Abandon(d.LockToken, nil))
	mustReceive(t, orders, PeekLock) // x, third delivery of 3
	mustReceive(t, orders, PeekLock) // y, first delivery
	b.Close()

	b2 := openPersistBroker(t, dir, mock, Options{})
	orders2, _ := b2.Queue("orders")
	assert.Equal(t, Stats{Active: 1, DeadLettered: 1}, orders2.Stats())
	d = mustReceive(t, orders2, PeekLock)
	assert.Equal(t, "first try", body(d))
	assert.Equal(t, uint32(1), d.Message.Header.DeliveryCount, "the delivery lost with the lock counts")
	dl := mustReceive(t, orders2.dlq, PeekLock)
	assert.Equal(t, ReasonMaxDeliveryCountExceeded, dl.Message.ApplicationProperties[PropertyDeadLetterReason])
}

// TestPersistSyncedStateSurvivesWithoutClose copies the directory while
// the broker runs, right after Sync, which is what a SIGKILL at that
// moment leaves behind: everything synced must be in the copy.
func TestPersistSyncedStateSurvivesWithoutClose(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	b := openPersistBroker(t, dir, mock, Options{})
	orders, _ := b.Queue("orders")
	for i := range 50 {
		mustSend(t, orders, newMsg(fmt.Sprint(i), fmt.Sprint(i)))
	}
	for range 20 {
		d := mustReceive(t, orders, PeekLock)
		require.NoError(t, orders.Complete(d.LockToken))
	}
	require.NoError(t, b.Sync(context.Background()))
	crashed := copyDir(t, dir)

	b2 := openPersistBroker(t, crashed, mock, Options{})
	orders2, _ := b2.Queue("orders")
	assert.Equal(t, 30, orders2.Stats().Active)
	assert.Equal(t, "20", body(mustReceive(t, orders2, PeekLock)))
}

// copyDir copies the regular files of dir (no lock is taken on a copy).
func copyDir(t testing.TB, dir string) string {
	t.Helper()
	dst := t.TempDir()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, de := range des {
		data, err := os.ReadFile(filepath.Join(dir, de.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, de.Name()), data, 0o644))
	}
	return dst
}

// currentJournal is the path of the one log file in dir.
func currentJournal(t *testing.T, dir string) string {
	t.Helper()
	gens, err := journalGenerations(dir)
	require.NoError(t, err)
	require.Len(t, gens, 1, "one journal after open or compaction")
	return filepath.Join(dir, journalName(gens[0]))
}

// TestPersistTornTail damages the end of the log as a crash in the middle
// of a write would (see persist_damage.go for the rule): everything before
// the damage survives, the torn record does not, and the reopened broker
// journals on normally.
func TestPersistTornTail(t *testing.T) {
	cases := []struct {
		name   string
		damage func(data []byte, recordStarts []int) []byte
		want   int // messages left of 5
	}{
		{"last record cut short", func(d []byte, starts []int) []byte { return d[:len(d)-3] }, 4},
		{"only part of the last header written", func(d []byte, starts []int) []byte { return d[:starts[4]+5] }, 4},
		{"last header written, its payload not", func(d []byte, starts []int) []byte { return d[:starts[4]+recordHeaderSize+1] }, 4},
		{"garbage appended, shorter than a header", func(d []byte, _ []int) []byte { return append(d, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5) }, 5},
		{"last record fails its checksum", func(d []byte, starts []int) []byte {
			d[starts[4]+recordHeaderSize+1] ^= 0xff
			return d
		}, 4},
		{"last header fails its checksum", func(d []byte, starts []int) []byte {
			d[starts[4]] ^= 0x01
			return d
		}, 4},
		{"last record zeroed, the file extended with zeros", func(d []byte, starts []int) []byte {
			clear(d[starts[4]+recordHeaderSize:])
			return append(d, make([]byte, 4096)...)
		}, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mock := newPersistClock()
			b := openPersistBroker(t, dir, mock, Options{})
			orders, _ := b.Queue("orders")
			for i := range 5 {
				mustSend(t, orders, newMsg(fmt.Sprint(i), fmt.Sprint(i)))
			}
			b.Close()
			path := currentJournal(t, dir)
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			starts := recordStarts(t, data)
			require.Len(t, starts, 5, "one record per send")
			require.NoError(t, os.WriteFile(path, tc.damage(data, starts), 0o644))

			b2 := openPersistBroker(t, dir, mock, Options{})
			orders2, _ := b2.Queue("orders")
			require.Equal(t, tc.want, orders2.Stats().Active)
			next := mustSend(t, orders2, newMsg("after", "after"))
			b2.Close()

			b3 := openPersistBroker(t, dir, mock, Options{})
			orders3, _ := b3.Queue("orders")
			assert.Equal(t, tc.want+1, orders3.Stats().Active, "records after the repaired tail are read")
			last := orders3.Peek(next, 1)
			require.Len(t, last, 1)
			assert.Equal(t, "after", string(last[0].Message.GetData()))
		})
	}
}

// recordStarts returns the offset of every record of an intact journal
// file's contents.
func recordStarts(t *testing.T, data []byte) []int {
	t.Helper()
	var starts []int
	for off := len(journalMagic); off < len(data); {
		starts = append(starts, off)
		_, size, fault := readFrame(data[off:])
		require.Equal(t, frameOK, fault, "record at %d", off)
		off += size
	}
	return starts
}

// TestPersistCompaction makes the journal compact every few records and
// checks that the state is intact, that old logs are gone and that the
// records after the last snapshot are replayed on top of it.
func TestPersistCompaction(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	b := openPersistBroker(t, dir, mock, Options{CompactAfter: 1})
	orders, _ := b.Queue("orders")
	for i := range 300 {
		mustSend(t, orders, withAppProps(newMsg(fmt.Sprint(i), fmt.Sprint(i)), map[string]any{"i": int64(i)}))
		if i%3 == 0 {
			d := mustReceive(t, orders, PeekLock)
			require.NoError(t, orders.Complete(d.LockToken))
		}
	}
	require.NoError(t, b.Sync(context.Background()))
	stats := b.JournalStats()
	assert.GreaterOrEqual(t, stats.Snapshots, int64(2), "compacted at least once after the snapshot at open: %+v", stats)
	before := dumpState(t, b)
	b.Close()
	_ = currentJournal(t, dir) // exactly one journal left

	b2 := openPersistBroker(t, dir, mock, Options{})
	assert.Equal(t, before, dumpState(t, b2))
	orders2, _ := b2.Queue("orders")
	assert.Equal(t, 200, orders2.Stats().Active)
	_, dup, err := orders2.Send(newMsg("299", "dup"), 100)
	require.NoError(t, err)
	assert.True(t, dup, "dedup history kept through snapshots")
}

// TestPersistGroupCommit sends from many goroutines and waits for each
// send's durability, as the AMQP server does: fewer fsyncs than records
// shows that concurrent changes shared them.
func TestPersistGroupCommit(t *testing.T) {
	dir := t.TempDir()
	b, err := New(Options{DataDir: dir}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	q, _ := b.Queue("q")
	const workers, each = 16, 50
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range each {
				if _, _, err := q.Send(newMsg(fmt.Sprint(w, "-", i), "x"), 10); err != nil {
					errs <- err
					return
				}
				if err := b.Sync(context.Background()); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
	st := b.JournalStats()
	t.Logf("%d records, %d fsyncs (%.1f records per fsync)", st.Records, st.Syncs, float64(st.Records)/float64(st.Syncs))
	assert.Equal(t, int64(workers*each), st.Records)
	assert.Less(t, st.Syncs, st.Records)
}

// TestPersistDirectoryInUse refuses a second broker on the same directory.
func TestPersistDirectoryInUse(t *testing.T) {
	dir := t.TempDir()
	b, err := New(Options{DataDir: dir}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	defer b.Close()
	_, err = New(Options{DataDir: dir}, QueueConfig{Name: "q"})
	require.ErrorIs(t, err, ErrPersistence)
	b.Close()
	b2, err := New(Options{DataDir: dir}, QueueConfig{Name: "q"})
	require.NoError(t, err, "free again after Close")
	b2.Close()
}

// TestPersistConfiguredEntitiesMerge: stored entities keep their stored
// settings, configured ones that are new are added.
func TestPersistConfiguredEntitiesMerge(t *testing.T) {
	dir := t.TempDir()
	b, err := New(Options{DataDir: dir}, QueueConfig{Name: "q", MaxDeliveryCount: 4})
	require.NoError(t, err)
	b.Close()
	b2, err := New(Options{DataDir: dir, Topics: []TopicConfig{{Name: "t"}}}, QueueConfig{Name: "Q", MaxDeliveryCount: 9}, QueueConfig{Name: "r"})
	require.NoError(t, err)
	defer b2.Close()
	cfg, _ := b2.QueueConfig("q")
	assert.Equal(t, 4, cfg.MaxDeliveryCount)
	assert.Equal(t, []string{"q", "r"}, b2.Queues())
	assert.Equal(t, []string{"t"}, b2.Topics())
}

// TestPersistCorruptSnapshotIsAnError: unlike a torn log, a damaged
// snapshot is not silently dropped, since that would lose acknowledged
// state.
func TestPersistCorruptSnapshotIsAnError(t *testing.T) {
	dir := t.TempDir()
	b, err := New(Options{DataDir: dir}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	b.Close()
	path := filepath.Join(dir, snapshotFile)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	data[len(data)-1] ^= 0xff
	require.NoError(t, os.WriteFile(path, data, 0o644))
	_, err = New(Options{DataDir: dir}, QueueConfig{Name: "q"})
	require.ErrorIs(t, err, ErrPersistence)
}

// FuzzReplayJournal feeds arbitrary bytes to the log reader: it must
// report damage or corruption, never panic, and a damage report must
// point inside the file, name it, and call a torn tail only damage that
// no intact record follows.
func FuzzReplayJournal(f *testing.F) {
	r := &recordEncoder{}
	r.lastSeq("q", 4)
	e, err := encodeEntry(newMsg("id", "body"), 4)
	require.NoError(f, err)
	r.put("q", 3, e)
	r.meta("q", 3, &entry{state: stateLocked, deliveryCount: 2})
	r.dedup("q", "string:id", 3, persistStart)
	r.delete("q", 3)
	f.Add(appendFramed([]byte(journalMagic), r.buf))
	f.Add([]byte(journalMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		img := newImage()
		img.setEntities(storedEntities{Queues: []QueueConfig{{Name: "q"}}})
		if d := img.replayJournal("journal-fuzz", data, -1); d != nil {
			if d.Offset < 0 || d.Offset > int64(len(data)) || d.Dropped != int64(len(data))-d.Offset {
				t.Fatalf("damage %+v outside a file of %d bytes", d, len(data))
			}
			if !strings.Contains(d.Error(), "journal-fuzz at offset") {
				t.Fatalf("error %q does not name the file and offset", d.Error())
			}
			if d.torn && (d.applied || intactRecordIn(data[d.Offset+1:])) {
				t.Fatalf("torn tail %+v with an intact record after it", d)
			}
		}
		keys := make([]string, 0, len(img.stored))
		for k := range img.stored {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for seq, m := range img.stored[k].msgs {
				_, _ = restoreEntry(m, seq, k)
			}
		}
	})
}

// FuzzReplaySnapshot feeds arbitrary bytes to the snapshot reader: a
// DamageError naming the file and an offset inside it, or success, never a
// panic.
func FuzzReplaySnapshot(f *testing.F) {
	r := &recordEncoder{}
	_ = r.entities(storedEntities{Queues: []QueueConfig{{Name: "q"}}}) // encodable
	r.lastSeq("q", 4)
	e, err := encodeEntry(newMsg("id", "body"), 4)
	require.NoError(f, err)
	r.put("q", 3, e)
	r.byte(opEnd)
	header := binary.LittleEndian.AppendUint64([]byte(snapshotMagic), 7)
	f.Add(appendFramed(header, r.buf))
	f.Add(header)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := newImage().replaySnapshot("snapshot", data)
		if err == nil {
			return
		}
		var de *DamageError
		if !errors.As(err, &de) || de.Offset < 0 || de.Offset > int64(len(data)) || !strings.Contains(err.Error(), "snapshot at offset") {
			t.Fatalf("error %v is not a DamageError inside the file", err)
		}
	})
}

// BenchmarkPersistReopen measures a restart with 10,000 messages of 1 KiB
// (with properties) in a queue: New on the directory (replay, and a
// snapshot when the directory needs one) and Close. from-journal starts from a
// directory whose messages are all in the journal, as after a crash;
// from-snapshot from one just reopened, whose messages are in the
// snapshot. A start that can go on appending to the directory's log
// writes no snapshot (persist.go, openLocked); one from the journal alone
// writes one.
//
//	go test -run '^$' -bench BenchmarkPersistReopen -benchtime 10x -count 5 ./sbemu/broker/
func BenchmarkPersistReopen(b *testing.B) {
	const n = 10000
	dir := b.TempDir()
	br, err := New(Options{DataDir: dir}, QueueConfig{Name: "q", DuplicateDetectionWindow: time.Hour})
	require.NoError(b, err)
	q, _ := br.Queue("q")
	payload := string(make([]byte, 1024))
	for i := range n {
		m := withAppProps(newMsg(fmt.Sprint("id-", i), payload), map[string]any{"i": int64(i), "kind": "bench"})
		_, _, err := q.Send(m, 1100)
		require.NoError(b, err)
	}
	br.Close()
	open := func(b *testing.B, dir string) {
		br, err := New(Options{DataDir: dir}, QueueConfig{Name: "q"})
		if err != nil {
			b.Fatal(err)
		}
		if got := br.JournalStats(); got.Snapshots > 1 {
			b.Fatalf("stats %+v", got)
		}
		br.Close()
	}
	b.Run("from-journal", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			d := copyDir(b, dir)
			b.StartTimer()
			open(b, d)
		}
	})
	b.Run("from-snapshot", func(b *testing.B) {
		d := copyDir(b, dir)
		open(b, d)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			open(b, d)
		}
	})
}

// BenchmarkPersistGroupCommit sends durably (Send, then Sync, as the AMQP
// server does before acknowledging) from 1 to 64 goroutines and reports
// fsyncs per send: one goroutine needs one fsync per send, more share
// them.
//
//	go test -run '^$' -bench BenchmarkPersistGroupCommit -count 5 ./sbemu/broker/
func BenchmarkPersistGroupCommit(b *testing.B) {
	for _, workers := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprint("workers=", workers), func(b *testing.B) {
			br, err := New(Options{DataDir: b.TempDir()}, QueueConfig{Name: "q"})
			require.NoError(b, err)
			defer br.Close()
			q, _ := br.Queue("q")
			m := newMsg(nil, string(make([]byte, 256)))
			before := br.JournalStats()
			b.ResetTimer()
			var next atomic.Int64
			errs := make(chan error, workers)
			for range workers {
				go func() {
					for next.Add(1) <= int64(b.N) {
						if _, _, err := q.Send(m, 300); err != nil {
							errs <- err
							return
						}
						if err := br.Sync(context.Background()); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for range workers {
				require.NoError(b, <-errs)
			}
			b.StopTimer()
			st := br.JournalStats()
			b.ReportMetric(float64(st.Syncs-before.Syncs)/float64(b.N), "fsyncs/send")
		})
	}
}

// A rule whose correlation filter holds a value the journal cannot encode is refused on a persistent
// broker, instead of being acknowledged and then stopping the journal.
func TestPersistentBrokerRefusesAnUnstorableRule(t *testing.T) {
	dir := t.TempDir()
	b, err := New(Options{DataDir: dir, Topics: []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "s"}}}}})
	require.NoError(t, err)
	defer b.Close()
	bad := RuleConfig{Name: "odd", CorrelationFilter: &CorrelationFilter{Properties: map[string]any{"k": amqp.Symbol("x")}}}
	require.ErrorIs(t, b.AddRule("t", "s", bad), ErrInvalidConfig)
	require.ErrorIs(t, b.AddSubscription("t", SubscriptionConfig{Name: "s2", Rules: []RuleConfig{bad}}), ErrInvalidConfig)
	require.NoError(t, b.Sync(context.Background()), "the journal still works")
	good := RuleConfig{Name: "fine", CorrelationFilter: &CorrelationFilter{Properties: map[string]any{"k": "x"}}}
	require.NoError(t, b.AddRule("t", "s", good))
	require.NoError(t, b.Sync(context.Background()))
}
