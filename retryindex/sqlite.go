package retryindex

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	// The pure-Go SQLite driver, registered as "sqlite": no cgo, no server.
	_ "modernc.org/sqlite"
)

// Defaults of [SQLiteOptions].
const (
	// DefaultMaxErrorLength bounds the error text stored per attempt, in bytes.
	DefaultMaxErrorLength = 512
	// defaultMaxEvents and defaultMaxHistory are the zero values of [LookupOptions].
	defaultMaxEvents  = 20
	defaultMaxHistory = 100
	// busyTimeout is how long a write waits for another process's write to the same file.
	busyTimeout = 10 * time.Second
)

// SQLiteOptions configures [OpenSQLite]. A nil *SQLiteOptions means every default.
type SQLiteOptions struct {
	// MaxErrorLength bounds the error text stored per attempt, in bytes, after redaction; a longer text
	// is cut at a character boundary and marked "…". Zero means [DefaultMaxErrorLength] (512); negative
	// is invalid.
	MaxErrorLength int
	// ReadOnly opens the file for reading only, as a console or sbretry does: the file must exist, and
	// Apply, SetCursor, MarkGone and Prune fail.
	ReadOnly bool
	// Now is the clock that stamps freshness ("as of") and feed times. Nil means time.Now.
	Now func() time.Time
}

// SQLite is the embedded [Store]: one SQLite database file in WAL mode (modernc.org/sqlite, pure Go).
// Several processes may open the same file (SQLite locks it); within one process, share one *SQLite. It
// is safe for concurrent use. Create it with [OpenSQLite]; the zero value is not usable.
type SQLite struct {
	// write has one connection, taken with BEGIN IMMEDIATE, so that writes queue here instead of
	// failing with SQLITE_BUSY; read has several, which WAL lets run beside the writer.
	write, read *sql.DB
	opts        SQLiteOptions

	// stmts are the write path's statements, prepared once on the write connection: parsing them for
	// every record cost two thirds of a write (measured: 6,000 records/s unprepared).
	stmts writeStmts
	batch batchStmts

	// bySource says the file has the indexes and counts by source entity (a read-only open of a file
	// no writer of this version has opened yet has not): without them, a listing or count of one
	// source scans every event of the state.
	bySource bool

	mu     sync.Mutex
	names  map[string]int64 // entity, source and process names, interned (see the names table)
	byID   map[int64]string
	fresh  []string // names the open write transaction added to names, forgotten if it rolls back
	closed bool
}

// Compile-time proof that *SQLite is a Store.
var _ Store = (*SQLite)(nil)

// schema creates the tables. counts holds the number of events per state, and source_counts per
// source entity and state, kept in the same transaction as every change (see countDeltas), so that
// exact counts cost a read of a few rows instead of a scan of every event (an index of events by state
// cost each write another B-tree insert). source_counts is created by addSourceCounts, which fills it
// in a file written before it existed. The pending and dead-lettered events are indexed by time, and
// by source entity and time, so that a page of one entity of a shared index costs what a page of all
// does. Times are Unix milliseconds (the precision of Service Bus), chains 20 bytes, and repeated
// strings (entities, sources, processes) small integers: see BENCHMARKS.md for the bytes per event
// this gives. key and corr are NULL when they equal original_id (the library's defaults),
// which lookups by key and correlation id then find through original_id.
const schema = `
CREATE TABLE IF NOT EXISTS names (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS events (
	id INTEGER PRIMARY KEY,
	chain BLOB NOT NULL UNIQUE,
	original_id TEXT NOT NULL,
	key TEXT,
	corr TEXT,
	source INTEGER,
	state INTEGER NOT NULL,
	pos INTEGER NOT NULL,
	attempt INTEGER NOT NULL,
	due INTEGER,
	entity INTEGER,
	seq INTEGER,
	updated INTEGER NOT NULL,
	feed INTEGER NOT NULL,
	kind INTEGER
);
CREATE INDEX IF NOT EXISTS events_original ON events(original_id);
CREATE INDEX IF NOT EXISTS events_key ON events(key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_corr ON events(corr) WHERE corr IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_pending ON events(due, id) WHERE state = 1;
CREATE INDEX IF NOT EXISTS events_dead ON events(updated, id) WHERE state = 4;
CREATE INDEX IF NOT EXISTS events_source_pending ON events(source, due, id) WHERE state = 1;
CREATE INDEX IF NOT EXISTS events_source_dead ON events(source, updated, id) WHERE state = 4;
CREATE TABLE IF NOT EXISTS attempts (
	event INTEGER NOT NULL,
	attempt INTEGER NOT NULL,
	kind INTEGER NOT NULL,
	at INTEGER NOT NULL,
	error TEXT,
	reason TEXT,
	next_due INTEGER,
	process INTEGER,
	feed INTEGER NOT NULL,
	immediate INTEGER,
	PRIMARY KEY (event, attempt, kind, at)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS feeds (name TEXT PRIMARY KEY, last INTEGER NOT NULL, cursor INTEGER NOT NULL DEFAULT 0, lost INTEGER NOT NULL DEFAULT 0, lost_at INTEGER);
CREATE TABLE IF NOT EXISTS counts (state INTEGER PRIMARY KEY, n INTEGER NOT NULL);
`

// OpenSQLite opens (creating unless ReadOnly) the index at path. The file is in WAL mode with
// synchronous=NORMAL: a committed write survives the process being killed (it is in the log); only a
// power loss may take the last commits, which the tailer then reads again from the broker.
func OpenSQLite(path string, opts *SQLiteOptions) (*SQLite, error) {
	var o SQLiteOptions
	if opts != nil {
		o = *opts
	}
	switch {
	case path == "":
		return nil, fmt.Errorf("%w: empty path", ErrInvalidOptions)
	case o.MaxErrorLength < 0:
		return nil, fmt.Errorf("%w: MaxErrorLength %d is negative", ErrInvalidOptions, o.MaxErrorLength)
	}
	if o.MaxErrorLength == 0 {
		o.MaxErrorLength = DefaultMaxErrorLength
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	pragmas := "_pragma=busy_timeout(" + strconv.Itoa(int(busyTimeout/time.Millisecond)) + ")&_pragma=synchronous(NORMAL)"
	s := &SQLite{opts: o, names: map[string]int64{}, byID: map[int64]string{}}
	base := "file:" + (&url.URL{Path: path}).EscapedPath()
	if o.ReadOnly {
		read, err := sql.Open("sqlite", base+"?mode=ro&"+pragmas)
		if err != nil {
			return nil, fmt.Errorf("retryindex: opening %s: %w", path, err)
		}
		s.read = read
		if err := read.Ping(); err != nil {
			_ = read.Close()
			return nil, fmt.Errorf("retryindex: opening %s: %w", path, err)
		}
		if s.bySource, err = hasSourceCounts(read); err != nil {
			_ = read.Close()
			return nil, fmt.Errorf("retryindex: opening %s: %w", path, err)
		}
		return s, nil
	}
	// A 32 MiB page cache (the default is 2 MiB) keeps the upper levels of the indexes in memory
	// while ids arrive in random order (the chain is a hash). The log is copied back into the file
	// (a checkpoint, with an fsync) every 10,000 pages (about 40 MB of log) instead of every 1,000:
	// an index page that many batches touch is then copied once for all of them (a fifth less CPU
	// per record in BenchmarkWriterBatch).
	write, err := sql.Open("sqlite", base+"?_txlock=immediate&_pragma=journal_mode(WAL)&_pragma=cache_size(-32768)&_pragma=wal_autocheckpoint(10000)&"+pragmas)
	if err != nil {
		return nil, fmt.Errorf("retryindex: opening %s: %w", path, err)
	}
	write.SetMaxOpenConns(1)
	if _, err := write.Exec(schema); err != nil {
		_ = write.Close()
		return nil, fmt.Errorf("retryindex: creating the schema in %s: %w", path, err)
	}
	if err := errors.Join(addColumns(write), addSourceCounts(write)); err != nil {
		_ = write.Close()
		return nil, fmt.Errorf("retryindex: upgrading the schema in %s: %w", path, err)
	}
	if err := errors.Join(s.stmts.prepare(write), s.batch.prepare(write)); err != nil {
		_ = write.Close()
		return nil, fmt.Errorf("retryindex: preparing the writes in %s: %w", path, err)
	}
	read, err := sql.Open("sqlite", base+"?"+pragmas)
	if err != nil {
		_ = write.Close()
		return nil, fmt.Errorf("retryindex: opening %s: %w", path, err)
	}
	s.write, s.read, s.bySource = write, read, true
	return s, nil
}

// writeStmts are the statements of the write path (apply).
type writeStmts struct {
	selectEvent, insertEvent, updateEvent, historySeen, insertAttempt, selectID *sql.Stmt
}

func (w *writeStmts) prepare(db *sql.DB) error {
	for _, p := range []struct {
		dst   **sql.Stmt
		query string
	}{
		{&w.selectEvent, `SELECT id, pos, state, updated, entity, seq, source FROM events WHERE chain = ?`},
		{&w.selectID, `SELECT id FROM events WHERE chain = ?`},
		{&w.insertEvent, eventInsertHead + eventRowParams},
		{&w.updateEvent, `UPDATE events SET state = ?, pos = ?, attempt = ?, due = ?, entity = ?, seq = ?, updated = ?, feed = ?, kind = ? WHERE id = ?`},
		{&w.historySeen, `SELECT count(*) FROM attempts WHERE event = ? AND attempt = ? AND kind = ?`},
		{&w.insertAttempt, attemptInsertHead + attemptRowParams},
	} {
		st, err := db.Prepare(p.query)
		if err != nil {
			return err
		}
		*p.dst = st
	}
	return nil
}

// txStmts are the write statements bound to one transaction.
type txStmts struct{ selectEvent, insertEvent, updateEvent, historySeen, insertAttempt *sql.Stmt }

func (s *SQLite) bind(ctx context.Context, tx *sql.Tx) *txStmts {
	return &txStmts{
		selectEvent: tx.StmtContext(ctx, s.stmts.selectEvent), insertEvent: tx.StmtContext(ctx, s.stmts.insertEvent),
		updateEvent: tx.StmtContext(ctx, s.stmts.updateEvent), historySeen: tx.StmtContext(ctx, s.stmts.historySeen),
		insertAttempt: tx.StmtContext(ctx, s.stmts.insertAttempt),
	}
}

// Close closes the database. It is idempotent.
func (s *SQLite) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.read.Close()
	if s.write != nil {
		err = errors.Join(err, s.write.Close())
	}
	return err
}

// writeTx runs fn in one write transaction, or says why it cannot.
func (s *SQLite) writeTx(ctx context.Context, fn func(*sqlTx) error) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case s.write == nil:
		return errors.New("retryindex: the index was opened read-only")
	}
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("retryindex: starting a write: %w", err)
	}
	err = fn(tx)
	if err != nil {
		_ = tx.Rollback()
	} else if err = tx.Commit(); err != nil {
		err = fmt.Errorf("retryindex: committing: %w", err)
	}
	s.mu.Lock()
	if err != nil {
		// A name inserted by a transaction that did not commit has no row: its id may be given to
		// another name later, so the cache must not keep it.
		for _, name := range s.fresh {
			delete(s.byID, s.names[name])
			delete(s.names, name)
		}
	}
	s.fresh = s.fresh[:0]
	s.mu.Unlock()
	return err
}

// readTx runs fn in one read transaction, a consistent snapshot; asOf is the store's clock at its start.
func (s *SQLite) readTx(ctx context.Context, fn func(tx *sql.Tx, asOf time.Time) error) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	tx, err := s.read.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("retryindex: starting a read: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	asOf := s.opts.Now()
	return fn(tx, asOf)
}

// nameID interns name in the names table (within tx) and returns its id; 0 for "".
func (s *SQLite) nameID(ctx context.Context, tx *sql.Tx, name string) (int64, error) {
	if name == "" {
		return 0, nil
	}
	s.mu.Lock()
	id, ok := s.names[name]
	s.mu.Unlock()
	if ok {
		return id, nil
	}
	if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO names(name) VALUES (?)`, name); err != nil {
		return 0, fmt.Errorf("retryindex: storing a name: %w", err)
	}
	if err := tx.QueryRowContext(ctx, `SELECT id FROM names WHERE name = ?`, name).Scan(&id); err != nil {
		return 0, fmt.Errorf("retryindex: reading a name: %w", err)
	}
	s.mu.Lock()
	s.names[name], s.byID[id] = id, name
	s.fresh = append(s.fresh, name)
	s.mu.Unlock()
	return id, nil
}

// nameOf returns the name behind id, reading it through q when not cached; "" for 0 or NULL.
func (s *SQLite) nameOf(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, id sql.NullInt64) string {
	if !id.Valid || id.Int64 == 0 {
		return ""
	}
	s.mu.Lock()
	name, ok := s.byID[id.Int64]
	s.mu.Unlock()
	if ok {
		return name
	}
	if err := q.QueryRowContext(ctx, `SELECT name FROM names WHERE id = ?`, id.Int64).Scan(&name); err != nil {
		return ""
	}
	s.mu.Lock()
	s.byID[id.Int64] = name
	s.mu.Unlock()
	return name
}

func feedCode(feed string) int {
	if feed == FeedTailer {
		return 1
	}
	return 0
}

func feedName(code int) string {
	if code == 1 {
		return FeedTailer
	}
	return FeedConsumer
}

func ms(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMilli(), Valid: true}
}

func fromMS(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMilli(v.Int64).UTC()
}

func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

// Apply folds records into their events, in one transaction. A record applies to the event's state
// when it is about a later stage (see [Record]) than the state it has, or the same stage and not older;
// it is added to the history in any case, except that a tailer's record repeats nothing the history
// already has for its attempt and kind.
func (s *SQLite) Apply(ctx context.Context, records []Record) error {
	for i := range records {
		if err := records[i].Validate(); err != nil {
			return err
		}
	}
	if len(records) == 0 {
		return nil
	}
	return s.writeTx(ctx, func(tx *sql.Tx) error {
		// The statements run without ctx: a context that can end costs the driver (modernc) a
		// goroutine per statement to watch it, which was a third of the writer's CPU (measured in
		// BenchmarkWriterBatch). ctx still bounds the wait for the write lock (BEGIN), and applyAll
		// checks it between records; a statement's own wait is bounded by the busy timeout.
		stop := ctx
		ctx := context.WithoutCancel(ctx)
		feeds := map[string]bool{}
		st := s.bind(ctx, tx)
		deltas := countDeltas{}
		if err := s.applyAll(stop, ctx, tx, st, deltas, records); err != nil {
			return err
		}
		for i := range records {
			if records[i].Feed != FeedTailer {
				feeds["consumer "+records[i].Process] = true
			}
		}
		if err := deltas.write(ctx, tx); err != nil {
			return err
		}
		now := s.opts.Now().UnixMilli()
		for name := range feeds {
			if _, err := tx.ExecContext(ctx, `INSERT INTO feeds(name, last) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET last = excluded.last`, name, now); err != nil {
				return fmt.Errorf("retryindex: recording the feed: %w", err)
			}
		}
		return nil
	})
}

func (s *SQLite) apply(ctx context.Context, tx *sql.Tx, st *txStmts, deltas countDeltas, r *Record) error {
	chain, _ := hex.DecodeString(r.Chain)
	state := stateOf(r.Kind)
	pos := r.position()
	attempt := r.Attempt
	if state == StatePending {
		attempt = r.NextAttempt
	}
	var due sql.NullInt64
	if state == StatePending {
		due = ms(r.NextDue)
	}
	entity, err := s.nameID(ctx, tx, r.Entity)
	if err != nil {
		return err
	}
	var seq sql.NullInt64
	if r.SequenceNumber > 0 {
		seq = sql.NullInt64{Int64: r.SequenceNumber, Valid: true}
	}
	at := r.At.UnixMilli()
	feed := feedCode(r.Feed)

	var id, curPos, curUpdated int64
	var curState State
	var curEntity, curSeq, curSource sql.NullInt64
	inserted := false
	insert := func() error {
		args, err := s.eventRow(ctx, tx, r)
		if err != nil {
			return err
		}
		res, err := st.insertEvent.ExecContext(ctx, args...)
		if err != nil {
			return fmt.Errorf("retryindex: inserting an event: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err // the chain exists: read it below
		}
		if id, err = res.LastInsertId(); err != nil {
			return fmt.Errorf("retryindex: inserting an event: %w", err)
		}
		inserted = true
		source, err := s.nameID(ctx, tx, r.Source) // interned by eventRow: read from the cache
		if err != nil {
			return err
		}
		deltas.add(source, state, 1)
		return nil
	}
	// A consumer's record of a first attempt is nearly always a new event: try the insert first and
	// save the read (a fifth of a write, measured). Anything else is nearly always an existing one.
	if r.Feed != FeedTailer && r.Attempt <= 1 {
		if err := insert(); err != nil {
			return err
		}
	}
	if !inserted {
		err = st.selectEvent.QueryRowContext(ctx, chain).Scan(&id, &curPos, &curState, &curUpdated, &curEntity, &curSeq, &curSource)
	}
	switch {
	case inserted:
	case errors.Is(err, sql.ErrNoRows):
		if err := insert(); err != nil {
			return err
		}
		if !inserted {
			return fmt.Errorf("retryindex: inserting an event: chain %s neither read nor inserted", r.Chain)
		}
	case err != nil:
		return fmt.Errorf("retryindex: reading an event: %w", err)
	case pos > curPos || (pos == curPos && at >= curUpdated):
		// A record of the same state that does not know where the copy is keeps what an earlier one
		// knew (the consumer's dead letter does not know the tailer's sequence number, say).
		if state == curState && entity == 0 && !seq.Valid {
			seq = curSeq
			entity = curEntity.Int64
		}
		_, err := st.updateEvent.ExecContext(ctx,
			state, pos, attempt, due, sql.NullInt64{Int64: entity, Valid: entity != 0}, seq, at, feed, int(r.Kind), id)
		if err != nil {
			return fmt.Errorf("retryindex: updating an event: %w", err)
		}
		deltas.add(curSource.Int64, curState, -1)
		deltas.add(curSource.Int64, state, 1)
	}
	if r.Feed == FeedTailer {
		var seen int
		err := st.historySeen.QueryRowContext(ctx, id, r.Attempt, int(r.Kind)).Scan(&seen)
		if err != nil {
			return fmt.Errorf("retryindex: reading the history: %w", err)
		}
		if seen > 0 {
			return nil
		}
	}
	args, err := s.attemptRow(ctx, tx, id, r)
	if err != nil {
		return err
	}
	if _, err = st.insertAttempt.ExecContext(ctx, args...); err != nil {
		return fmt.Errorf("retryindex: adding to the history: %w", err)
	}
	return nil
}

// eventRow is the insertEvent statement's arguments for the event r starts: its 14 columns.
func (s *SQLite) eventRow(ctx context.Context, tx *sql.Tx, r *Record) ([]any, error) {
	chain, _ := hex.DecodeString(r.Chain)
	state := stateOf(r.Kind)
	attempt := r.Attempt
	var due sql.NullInt64
	if state == StatePending {
		attempt, due = r.NextAttempt, ms(r.NextDue)
	}
	entity, err := s.nameID(ctx, tx, r.Entity)
	if err != nil {
		return nil, err
	}
	source, err := s.nameID(ctx, tx, r.Source)
	if err != nil {
		return nil, err
	}
	var seq sql.NullInt64
	if r.SequenceNumber > 0 {
		seq = sql.NullInt64{Int64: r.SequenceNumber, Valid: true}
	}
	key, corr := r.Key, r.CorrelationID
	if key == r.OriginalID {
		key = ""
	}
	if corr == r.OriginalID {
		corr = ""
	}
	return []any{chain, r.OriginalID, nullString(key), nullString(corr), sql.NullInt64{Int64: source, Valid: source != 0},
		state, r.position(), attempt, due, sql.NullInt64{Int64: entity, Valid: entity != 0}, seq, r.At.UnixMilli(), feedCode(r.Feed), int(r.Kind)}, nil
}

// attemptRow is the insertAttempt statement's arguments for r's history entry of event id: its 10
// columns.
func (s *SQLite) attemptRow(ctx context.Context, tx *sql.Tx, id int64, r *Record) ([]any, error) {
	process, err := s.nameID(ctx, tx, r.Process)
	if err != nil {
		return nil, err
	}
	return []any{id, r.Attempt, int(r.Kind), r.At.UnixMilli(), nullString(RedactError(r.Error, s.opts.MaxErrorLength)), nullString(r.Reason),
		ms(r.NextDue), sql.NullInt64{Int64: process, Valid: process != 0}, feedCode(r.Feed), sql.NullInt64{Int64: int64(r.Immediate), Valid: r.Immediate != 0}}, nil
}

// eventColumns are read by scanEvent, in its order; the last error comes from the newest history
// entry that has one, so that no event stores its error twice.
const eventColumns = `e.id, e.chain, e.original_id, e.key, e.corr, e.source, e.state, e.kind, e.attempt, e.due, e.entity, e.seq, e.updated, e.feed,
	(SELECT a.error FROM attempts a WHERE a.event = e.id AND a.error IS NOT NULL ORDER BY a.attempt DESC, a.at DESC LIMIT 1),
	(SELECT a.reason FROM attempts a WHERE a.event = e.id AND a.reason IS NOT NULL ORDER BY a.attempt DESC, a.at DESC LIMIT 1),
	(SELECT a.immediate FROM attempts a WHERE a.event = e.id ORDER BY a.attempt DESC, a.at DESC LIMIT 1)`

type rowScanner interface{ Scan(dest ...any) error }

func (s *SQLite) scanEvent(ctx context.Context, tx *sql.Tx, row rowScanner) (int64, Event, error) {
	var (
		id              int64
		chain           []byte
		e               Event
		key, corr       sql.NullString
		source, entity  sql.NullInt64
		due, seq        sql.NullInt64
		updated         int64
		feed            int
		lastErr, reason sql.NullString
		immediate, kind sql.NullInt64
	)
	err := row.Scan(&id, &chain, &e.OriginalID, &key, &corr, &source, &e.State, &kind, &e.Attempt, &due, &entity, &seq, &updated, &feed, &lastErr, &reason, &immediate)
	if err != nil {
		return 0, e, err
	}
	e.Chain = hex.EncodeToString(chain)
	e.Key, e.CorrelationID = key.String, corr.String
	if e.Key == "" {
		e.Key = e.OriginalID
	}
	if e.CorrelationID == "" {
		e.CorrelationID = e.OriginalID
	}
	e.Source = s.nameOf(ctx, tx, source)
	e.Entity = s.nameOf(ctx, tx, entity)
	e.Due = fromMS(due)
	e.SequenceNumber = seq.Int64
	e.Updated = time.UnixMilli(updated).UTC()
	e.Feed = feedName(feed)
	e.LastError, e.Reason = lastErr.String, reason.String
	e.Immediate, e.Kind = int(immediate.Int64), Kind(kind.Int64)
	return id, e, nil
}

func (lo *LookupOptions) withDefaults() (LookupOptions, error) {
	var o LookupOptions
	if lo != nil {
		o = *lo
	}
	if o.MaxEvents < 0 || o.MaxHistory < 0 {
		return o, fmt.Errorf("%w: negative LookupOptions bound", ErrInvalidOptions)
	}
	if o.MaxEvents == 0 {
		o.MaxEvents = defaultMaxEvents
	}
	if o.MaxHistory == 0 {
		o.MaxHistory = defaultMaxHistory
	}
	return o, nil
}

// Lookup implements [Store.Lookup]: by chain (a retry MessageID names its chain), else through the
// indexes on the original id, key and correlation id.
func (s *SQLite) Lookup(ctx context.Context, id string, opts *LookupOptions) (*Answer, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if id == "" {
		return nil, errors.New("retryindex: empty id")
	}
	ans := &Answer{ID: id}
	err = s.readTx(ctx, func(tx *sql.Tx, asOf time.Time) error {
		ans.AsOf = asOf
		var rows *sql.Rows
		var err error
		chain, isCopy := ChainOfMessageID(id)
		if !isCopy && IsChainID(id) {
			chain, isCopy = id, true
		}
		if isCopy {
			raw, _ := hex.DecodeString(chain)
			rows, err = tx.QueryContext(ctx, `SELECT `+eventColumns+` FROM events e WHERE e.chain = ?`, raw)
		} else {
			rows, err = tx.QueryContext(ctx, `SELECT `+eventColumns+` FROM events e WHERE e.id IN (
				SELECT id FROM events WHERE original_id = ?1 UNION SELECT id FROM events WHERE key = ?1 UNION SELECT id FROM events WHERE corr = ?1)
				ORDER BY e.updated DESC, e.id DESC LIMIT ?2`, id, o.MaxEvents+1)
		}
		if err != nil {
			return fmt.Errorf("retryindex: looking up: %w", err)
		}
		var ids []int64
		for rows.Next() {
			eid, e, err := s.scanEvent(ctx, tx, rows)
			if err != nil {
				_ = rows.Close()
				return fmt.Errorf("retryindex: reading an event: %w", err)
			}
			ids = append(ids, eid)
			ans.Events = append(ans.Events, e)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("retryindex: looking up: %w", err)
		}
		if len(ans.Events) > o.MaxEvents {
			ans.Events, ids, ans.Truncated = ans.Events[:o.MaxEvents], ids[:o.MaxEvents], true
		}
		for i, eid := range ids {
			h, err := s.history(ctx, tx, eid, o.MaxHistory)
			if err != nil {
				return err
			}
			ans.Events[i].History = h
		}
		ans.Feeds, err = s.feeds(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return ans, nil
}

// history reads the newest limit entries of an event's history, returned oldest first.
func (s *SQLite) history(ctx context.Context, tx *sql.Tx, event int64, limit int) ([]Attempt, error) {
	rows, err := tx.QueryContext(ctx, `SELECT attempt, kind, at, error, reason, next_due, process, feed, immediate FROM attempts WHERE event = ? ORDER BY attempt DESC, at DESC LIMIT ?`, event, limit)
	if err != nil {
		return nil, fmt.Errorf("retryindex: reading the history: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []Attempt
	for rows.Next() {
		var a Attempt
		var at int64
		var errText, reason sql.NullString
		var next, process, immediate sql.NullInt64
		var feed int
		if err := rows.Scan(&a.Attempt, &a.Kind, &at, &errText, &reason, &next, &process, &feed, &immediate); err != nil {
			return nil, fmt.Errorf("retryindex: reading the history: %w", err)
		}
		a.At = time.UnixMilli(at).UTC()
		a.Error, a.Reason = errText.String, reason.String
		a.NextDue = fromMS(next)
		a.Process = s.nameOf(ctx, tx, process)
		a.Feed = feedName(feed)
		a.Immediate = int(immediate.Int64)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("retryindex: reading the history: %w", err)
	}
	slices.Reverse(out)
	return out, nil
}

func (s *SQLite) feeds(ctx context.Context, tx *sql.Tx) ([]FeedStatus, error) {
	rows, err := tx.QueryContext(ctx, `SELECT name, last, cursor, lost, lost_at FROM feeds ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("retryindex: reading the feeds: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []FeedStatus
	for rows.Next() {
		var f FeedStatus
		var last int64
		var lostAt sql.NullInt64
		if err := rows.Scan(&f.Name, &last, &f.Cursor, &f.Lost, &lostAt); err != nil {
			return nil, fmt.Errorf("retryindex: reading the feeds: %w", err)
		}
		f.Last, f.LostAt = time.UnixMilli(last).UTC(), fromMS(lostAt)
		out = append(out, f)
	}
	return out, rows.Err()
}

// Freshness implements [Store.Freshness].
func (s *SQLite) Freshness(ctx context.Context) (*Freshness, error) {
	var f Freshness
	err := s.readTx(ctx, func(tx *sql.Tx, asOf time.Time) error {
		f.AsOf = asOf
		var err error
		f.Feeds, err = s.feeds(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &f, nil
}

// Pending implements [Store.Pending] through the partial index of pending events by due time: a page
// costs its own size, whatever the backlog. The cursor is the last row's due time and id.
func (s *SQLite) Pending(ctx context.Context, opts *PendingOptions) (*PendingPage, error) {
	return s.list(ctx, opts, listPending)
}

// DeadLettered implements [Store.DeadLettered] through the partial index of dead-lettered events by
// time. The cursor is the last row's time and id.
func (s *SQLite) DeadLettered(ctx context.Context, opts *PendingOptions) (*PendingPage, error) {
	return s.list(ctx, opts, listDeadLettered)
}

// listing is one of the two listings in index order: pending by due time, earliest first, or
// dead-lettered by time, newest first.
type listing struct {
	state State
	// index and bySource are the partial indexes of the state: by time, and by source entity and
	// time; key is the time column they order by.
	index, bySource, key string
	desc                 bool
}

var (
	listPending      = listing{state: StatePending, index: "events_pending", bySource: "events_source_pending", key: "due"}
	listDeadLettered = listing{state: StateDeadLettered, index: "events_dead", bySource: "events_source_dead", key: "updated", desc: true}
)

// sourceID is the id of the source entity name in the names table, or -1 (which no name has, so that
// nothing matches) when no event ever started there.
func sourceID(ctx context.Context, tx *sql.Tx, name string) (int64, error) {
	var id int64 = -1
	if err := tx.QueryRowContext(ctx, `SELECT id FROM names WHERE name = ?`, name).Scan(&id); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("retryindex: reading a name: %w", err)
	}
	return id, nil
}

func (s *SQLite) list(ctx context.Context, opts *PendingOptions, l listing) (*PendingPage, error) {
	o, afterKey, afterID, err := opts.Parse(l.desc)
	if err != nil {
		return nil, err
	}
	page := &PendingPage{}
	err = s.readTx(ctx, func(tx *sql.Tx, asOf time.Time) error {
		page.AsOf = asOf
		index, filter := l.index, ""
		args := []any{afterKey, afterID}
		if o.Source != "" {
			source, err := sourceID(ctx, tx, o.Source)
			if err != nil {
				return err
			}
			filter = " AND e.source = ?"
			args = append(args, source)
			if s.bySource {
				index = l.bySource
			}
		}
		cmpOp, order := ">", "e."+l.key+", e.id"
		if l.desc {
			cmpOp, order = "<", "e."+l.key+" DESC, e.id DESC"
		}
		rows, err := tx.QueryContext(ctx, `SELECT `+eventColumns+` FROM events e INDEXED BY `+index+`
			WHERE e.state = `+itoa(int(l.state))+` AND (e.`+l.key+`, e.id) `+cmpOp+` (?, ?)`+filter+` ORDER BY `+order+` LIMIT ?`, append(args, o.Limit+1)...)
		if err != nil {
			return fmt.Errorf("retryindex: listing %v: %w", l.state, err)
		}
		var last [2]int64
		for rows.Next() {
			eid, e, err := s.scanEvent(ctx, tx, rows)
			if err != nil {
				_ = rows.Close()
				return fmt.Errorf("retryindex: listing %v: %w", l.state, err)
			}
			if len(page.Items) == o.Limit {
				page.Next = strconv.FormatInt(last[0], 10) + "." + strconv.FormatInt(last[1], 10)
				break
			}
			key := e.Due
			if l.desc {
				key = e.Updated
			}
			last = [2]int64{key.UnixMilli(), eid}
			page.Items = append(page.Items, e)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("retryindex: listing %v: %w", l.state, err)
		}
		page.Total, err = s.count(ctx, tx, l.state, args[2:]...)
		if err != nil {
			return err
		}
		page.Feeds, err = s.feeds(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// count is the exact number of events in state st, of the source whose id is source[0] when given:
// a read of the counts, or, in a file without the counts by source (read-only, not yet upgraded), a
// scan of the state's events.
func (s *SQLite) count(ctx context.Context, tx *sql.Tx, st State, source ...any) (int64, error) {
	// The state is a literal, so that the scan can use the state's partial index.
	q := `SELECT coalesce((SELECT n FROM counts WHERE state = ` + itoa(int(st)) + `), 0)`
	switch {
	case len(source) > 0 && s.bySource:
		q = `SELECT coalesce((SELECT n FROM source_counts WHERE state = ` + itoa(int(st)) + ` AND source = ?), 0)`
	case len(source) > 0:
		q = `SELECT count(*) FROM events WHERE state = ` + itoa(int(st)) + ` AND source = ?`
	}
	var n int64
	if err := tx.QueryRowContext(ctx, q, source...).Scan(&n); err != nil {
		return 0, fmt.Errorf("retryindex: counting %v: %w", st, err)
	}
	return n, nil
}

// Counts implements [Store.Counts] from the counts tables, in one snapshot.
func (s *SQLite) Counts(ctx context.Context, opts *CountsOptions) (*Counts, error) {
	var o CountsOptions
	if opts != nil {
		o = *opts
	}
	c := &Counts{ByState: map[State]int64{}}
	err := s.readTx(ctx, func(tx *sql.Tx, asOf time.Time) error {
		c.AsOf = asOf
		q, args := `SELECT state, n FROM counts WHERE n != 0`, []any(nil)
		if o.Source != "" {
			source, err := sourceID(ctx, tx, o.Source)
			if err != nil {
				return err
			}
			q, args = `SELECT state, n FROM source_counts WHERE source = ? AND n != 0`, []any{source}
			if !s.bySource {
				q = `SELECT state, count(*) FROM events WHERE source = ? GROUP BY state`
			}
		}
		rows, err := tx.QueryContext(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("retryindex: counting: %w", err)
		}
		for rows.Next() {
			var st State
			var n int64
			if err := rows.Scan(&st, &n); err != nil {
				_ = rows.Close()
				return fmt.Errorf("retryindex: counting: %w", err)
			}
			c.ByState[st] = n
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("retryindex: counting: %w", err)
		}
		c.Feeds, err = s.feeds(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// PendingHistogram implements [Store.PendingHistogram] in one snapshot, through the partial index of
// pending events by due time (by source and due time for one source): the bounds are a lookup each,
// and each count a walk of the index entries it counts (the entries only, not the events).
func (s *SQLite) PendingHistogram(ctx context.Context, opts *HistogramOptions) (*Histogram, error) {
	var o HistogramOptions
	if opts != nil {
		o = *opts
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	h := &Histogram{From: o.From, Width: o.Width}
	err := s.readTx(ctx, func(tx *sql.Tx, asOf time.Time) error {
		h.AsOf = asOf
		index, filter, args := "events_pending", "", []any(nil)
		if o.Source != "" {
			source, err := sourceID(ctx, tx, o.Source)
			if err != nil {
				return err
			}
			filter, args = " AND source = ?", []any{source}
			if s.bySource {
				index = "events_source_pending"
			}
		}
		var err error
		if h.Total, err = s.count(ctx, tx, StatePending, args...); err != nil {
			return err
		}
		return histogram(ctx, tx, h, o, `FROM events INDEXED BY `+index+` WHERE state = 1`+filter, args)
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// histogram fills h as o asks from the pending events that from (a FROM and WHERE clause, with
// its args) selects, through an index that orders them by due time.
func histogram(ctx context.Context, tx *sql.Tx, h *Histogram, o HistogramOptions, from string, args []any) error {
	lo, hi := o.Bounds()
	inRange := append(slices.Clone(args), lo, hi)
	for _, b := range []struct {
		dst   *time.Time
		order string
	}{{&h.First, ""}, {&h.Last, " DESC"}} {
		var due int64
		err := tx.QueryRowContext(ctx, `SELECT due `+from+` AND due >= ? AND due <= ? ORDER BY due`+b.order+` LIMIT 1`, inRange...).Scan(&due)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return fmt.Errorf("retryindex: reading the due times: %w", err)
		default:
			*b.dst = time.UnixMilli(due).UTC()
		}
	}
	n := o.Buckets()
	if n == 0 {
		return nil
	}
	for _, c := range []struct {
		dst  *int64
		cond string
		arg  int64
	}{{&h.Before, "due < ?", lo}, {&h.After, "due > ?", hi}} {
		if err := tx.QueryRowContext(ctx, `SELECT count(*) `+from+` AND `+c.cond, append(slices.Clone(args), c.arg)...).Scan(c.dst); err != nil {
			return fmt.Errorf("retryindex: counting the due times: %w", err)
		}
	}
	// A count per bucket, each a walk of its range of the index: the engine steps through the index
	// entries and nothing else. One GROUP BY of the bucket number sorted every entry into a temporary
	// B-tree first: five times slower at 1,000,000 (430–580 against 80–120 ms).
	count, err := tx.PrepareContext(ctx, `SELECT count(*) `+from+` AND due >= ? AND due < ?`)
	if err != nil {
		return fmt.Errorf("retryindex: counting the due times: %w", err)
	}
	defer func() { _ = count.Close() }()
	h.Counts = make([]int64, n)
	width := o.Width.Milliseconds()
	for i := range h.Counts {
		start := lo + int64(i)*width
		if err := count.QueryRowContext(ctx, append(slices.Clone(args), start, min(start+width, hi+1))...).Scan(&h.Counts[i]); err != nil {
			return fmt.Errorf("retryindex: counting the due times: %w", err)
		}
	}
	return nil
}

// finished lists the states Prune may delete, as SQL.
const finished = `(3, 4, 5, 6)`

// Prune implements [Store.Prune].
func (s *SQLite) Prune(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		cut := before.UnixMilli()
		if _, err := tx.ExecContext(ctx, `DELETE FROM attempts WHERE event IN (SELECT id FROM events WHERE state IN `+finished+` AND updated < ?)`, cut); err != nil {
			return fmt.Errorf("retryindex: pruning the history: %w", err)
		}
		deltas := countDeltas{}
		rows, err := tx.QueryContext(ctx, `DELETE FROM events WHERE state IN `+finished+` AND updated < ? RETURNING state, source`, cut)
		if err != nil {
			return fmt.Errorf("retryindex: pruning events: %w", err)
		}
		for rows.Next() {
			var st State
			var source sql.NullInt64
			if err := rows.Scan(&st, &source); err != nil {
				_ = rows.Close()
				return fmt.Errorf("retryindex: pruning events: %w", err)
			}
			deltas.add(source.Int64, st, -1)
			n++
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("retryindex: pruning events: %w", err)
		}
		return deltas.write(ctx, tx)
	})
	return n, err
}

// Cursor implements [Store.Cursor].
func (s *SQLite) Cursor(ctx context.Context, entity string) (int64, error) {
	var next int64
	err := s.readTx(ctx, func(tx *sql.Tx, _ time.Time) error {
		err := tx.QueryRowContext(ctx, `SELECT cursor FROM feeds WHERE name = ?`, "tailer "+entity).Scan(&next)
		if errors.Is(err, sql.ErrNoRows) {
			next = 0
			return nil
		}
		return err
	})
	return next, err
}

// SetCursor implements [Store.SetCursor].
func (s *SQLite) SetCursor(ctx context.Context, entity string, next int64, records []Record) error {
	for i := range records {
		if err := records[i].Validate(); err != nil {
			return err
		}
	}
	return s.writeTx(ctx, func(tx *sql.Tx) error {
		st := s.bind(ctx, tx)
		deltas := countDeltas{}
		for i := range records {
			if err := s.apply(ctx, tx, st, deltas, &records[i]); err != nil {
				return err
			}
		}
		if err := deltas.write(ctx, tx); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO feeds(name, last, cursor) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET last = excluded.last, cursor = excluded.cursor`,
			"tailer "+entity, s.opts.Now().UnixMilli(), next)
		if err != nil {
			return fmt.Errorf("retryindex: recording the cursor: %w", err)
		}
		return nil
	})
}

// MarkGone implements [Store.MarkGone].
func (s *SQLite) MarkGone(ctx context.Context, entity string, since time.Time, seen func(chain string) bool) (int64, error) {
	var n int64
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		eid, err := s.nameID(ctx, tx, entity)
		if err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, chain, attempt, state, source FROM events WHERE state IN (1, 2) AND entity = ? AND updated < ?`,
			eid, since.UnixMilli())
		if err != nil {
			return fmt.Errorf("retryindex: finding gone copies: %w", err)
		}
		type gone struct {
			id      int64
			attempt int
			state   State
			source  sql.NullInt64
		}
		var marks []gone
		for rows.Next() {
			var g gone
			var chain []byte
			if err := rows.Scan(&g.id, &chain, &g.attempt, &g.state, &g.source); err != nil {
				_ = rows.Close()
				return fmt.Errorf("retryindex: finding gone copies: %w", err)
			}
			if !seen(hex.EncodeToString(chain)) {
				marks = append(marks, g)
			}
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("retryindex: finding gone copies: %w", err)
		}
		now := s.opts.Now().UnixMilli()
		deltas := countDeltas{}
		for _, g := range marks {
			deltas.add(g.source.Int64, g.state, -1)
			deltas.add(g.source.Int64, StateGone, 1)
			if _, err := tx.ExecContext(ctx, `UPDATE events SET state = ?, due = NULL, updated = ?, feed = 1, kind = ? WHERE id = ?`, StateGone, now, int(KindGone), g.id); err != nil {
				return fmt.Errorf("retryindex: marking a copy gone: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO attempts(event, attempt, kind, at, feed) VALUES (?, ?, ?, ?, 1)`, g.id, g.attempt, int(KindGone), now); err != nil {
				return fmt.Errorf("retryindex: marking a copy gone: %w", err)
			}
		}
		n = int64(len(marks))
		return deltas.write(ctx, tx)
	})
	return n, err
}

// addColumns adds the columns an index written before they existed lacks (CREATE TABLE IF NOT
// EXISTS leaves an existing table as it is): the feeds' lost and lost_at, the history's immediate,
// the events' kind. Each is a change of the schema only (SQLite adds a column without rewriting rows).
func addColumns(db *sql.DB) error {
	for _, c := range []struct{ table, column, add string }{
		{"feeds", "lost", `ALTER TABLE feeds ADD COLUMN lost INTEGER NOT NULL DEFAULT 0; ALTER TABLE feeds ADD COLUMN lost_at INTEGER`},
		{"attempts", "immediate", `ALTER TABLE attempts ADD COLUMN immediate INTEGER`},
		{"events", "kind", `ALTER TABLE events ADD COLUMN kind INTEGER`},
	} {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pragma_table_info(?) WHERE name = ?`, c.table, c.column).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if _, err := db.Exec(c.add); err != nil {
			return err
		}
	}
	return nil
}

// addSourceCounts creates the counts by source entity and state, filled from the events, in a file
// written before they existed (and empty in a new one), in one write transaction: a second process
// opening the same file at once finds them made. An older version writing the file afterwards keeps
// the counts by state but not these: once a file is opened by this version, write it with this
// version or later (see CHANGELOG.md).
func addSourceCounts(db *sql.DB) error {
	tx, err := db.Begin() // BEGIN IMMEDIATE: the write connection's lock mode
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var n int
	if err := tx.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'source_counts'`).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	_, err = tx.Exec(`CREATE TABLE source_counts (source INTEGER NOT NULL, state INTEGER NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (source, state)) WITHOUT ROWID;
		INSERT INTO source_counts(source, state, n) SELECT coalesce(source, 0), state, count(*) FROM events GROUP BY 1, 2`)
	if err != nil {
		return err
	}
	return tx.Commit()
}

// hasSourceCounts says whether the file has the counts by source (and so the indexes by source,
// created before them).
func hasSourceCounts(db *sql.DB) (bool, error) {
	var n int
	err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'source_counts'`).Scan(&n)
	return n > 0, err
}

// NoteLost implements [Store.NoteLost].
func (s *SQLite) NoteLost(ctx context.Context, feed string, n int64) error {
	return s.writeTx(ctx, func(tx *sql.Tx) error {
		now := s.opts.Now().UnixMilli()
		_, err := tx.ExecContext(ctx, `INSERT INTO feeds(name, last, lost, lost_at) VALUES (?, ?, ?, ?)
			ON CONFLICT(name) DO UPDATE SET lost = lost + excluded.lost, lost_at = excluded.lost_at`, feed, now, n, now)
		if err != nil {
			return fmt.Errorf("retryindex: noting lost records: %w", err)
		}
		return nil
	})
}

// ClearLost implements [Store.ClearLost].
func (s *SQLite) ClearLost(ctx context.Context, before time.Time) error {
	return s.writeTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE feeds SET lost = 0, lost_at = NULL WHERE lost != 0 AND lost_at < ?`, before.UnixMilli()); err != nil {
			return fmt.Errorf("retryindex: clearing lost records: %w", err)
		}
		return nil
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

// sqlTx is the transaction type writeTx passes, named so that tests can write through it.
type sqlTx = sql.Tx

// countKey is a row of source_counts: a source entity (its name's id, 0 for none) and a state.
type countKey struct {
	source int64
	state  State
}

// countDeltas are the changes of one transaction to the counts, by source entity and state.
type countDeltas map[countKey]int64

// add counts n more events of source in state st.
func (d countDeltas) add(source int64, st State, n int64) { d[countKey{source, st}] += n }

// write adds the deltas to the counts tables (by state, and by source and state), within the
// transaction that made them: one statement per row changed, whatever the records.
func (d countDeltas) write(ctx context.Context, tx *sql.Tx) error {
	byState := map[State]int64{}
	for k, n := range d {
		byState[k.state] += n
		if n == 0 {
			continue
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO source_counts(source, state, n) VALUES (?, ?, ?) ON CONFLICT(source, state) DO UPDATE SET n = n + excluded.n`, k.source, k.state, n)
		if err != nil {
			return fmt.Errorf("retryindex: counting: %w", err)
		}
	}
	for st, n := range byState {
		if n == 0 {
			continue
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO counts(state, n) VALUES (?, ?) ON CONFLICT(state) DO UPDATE SET n = n + excluded.n`, st, n)
		if err != nil {
			return fmt.Errorf("retryindex: counting: %w", err)
		}
	}
	return nil
}
