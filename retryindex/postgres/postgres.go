package postgres

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sbretry/retry/retryindex"
)

// Options configures [Open]. A nil *Options means every default.
type Options struct {
	// MaxErrorLength bounds the error text stored per attempt, in bytes, after redaction. Zero means
	// [retryindex.DefaultMaxErrorLength] (512); negative is invalid.
	MaxErrorLength int
	// Now is the clock that stamps freshness ("as of") and feed times. Nil means time.Now.
	Now func() time.Time
}

// Store is the Postgres [retryindex.Store]. Create it with [Open]; the zero value is not usable. It is
// safe for concurrent use, and several processes may share one database.
type Store struct {
	pool   *pgxpool.Pool
	opts   Options
	closed atomic.Bool
}

// Compile-time proof that *Store is a retryindex.Store.
var _ retryindex.Store = (*Store)(nil)

// schema creates the tables, as the embedded store's (times in Unix milliseconds, the chain as 20
// bytes), without the names table: Postgres compresses nothing less for a repeated short string. The
// counts by source entity are created by sourceCounts, which fills them in a database written before
// they existed.
const schema = `
CREATE TABLE IF NOT EXISTS sbretry_events (
	id bigserial PRIMARY KEY,
	chain bytea NOT NULL UNIQUE,
	original_id text NOT NULL,
	key text,
	corr text,
	source text,
	state smallint NOT NULL,
	pos bigint NOT NULL,
	attempt integer NOT NULL,
	due bigint,
	entity text,
	seq bigint,
	updated bigint NOT NULL,
	feed smallint NOT NULL
);
CREATE INDEX IF NOT EXISTS sbretry_events_original ON sbretry_events(original_id);
CREATE INDEX IF NOT EXISTS sbretry_events_key ON sbretry_events(key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS sbretry_events_corr ON sbretry_events(corr) WHERE corr IS NOT NULL;
CREATE INDEX IF NOT EXISTS sbretry_events_pending ON sbretry_events(due, id) WHERE state = 1;
CREATE INDEX IF NOT EXISTS sbretry_events_dead ON sbretry_events(updated, id) WHERE state = 4;
CREATE TABLE IF NOT EXISTS sbretry_attempts (
	event bigint NOT NULL,
	attempt integer NOT NULL,
	kind smallint NOT NULL,
	at bigint NOT NULL,
	error text,
	reason text,
	next_due bigint,
	process text,
	feed smallint NOT NULL,
	PRIMARY KEY (event, attempt, kind, at)
);
CREATE TABLE IF NOT EXISTS sbretry_feeds (name text PRIMARY KEY, last bigint NOT NULL, cursor bigint NOT NULL DEFAULT 0);
ALTER TABLE sbretry_feeds ADD COLUMN IF NOT EXISTS lost bigint NOT NULL DEFAULT 0;
ALTER TABLE sbretry_feeds ADD COLUMN IF NOT EXISTS lost_at bigint;
ALTER TABLE sbretry_attempts ADD COLUMN IF NOT EXISTS immediate integer;
ALTER TABLE sbretry_events ADD COLUMN IF NOT EXISTS kind smallint;
CREATE TABLE IF NOT EXISTS sbretry_counts (state smallint PRIMARY KEY, n bigint NOT NULL);
CREATE INDEX IF NOT EXISTS sbretry_events_source_pending ON sbretry_events(source, due, id) WHERE state = 1;
CREATE INDEX IF NOT EXISTS sbretry_events_source_dead ON sbretry_events(source, updated, id) WHERE state = 4;
`

// sourceCounts creates sbretry_source_counts, the number of events per source entity (” for none)
// and state, kept with every change as sbretry_counts is, filled from the events when the database
// was written before the table existed. The events are locked against writes while it is filled, so
// that no change is counted twice or missed. An older version writing the database afterwards keeps
// sbretry_counts but not these: once a database is opened by this version, write it with this
// version or later (see CHANGELOG.md).
const sourceCounts = `
LOCK TABLE sbretry_events IN SHARE MODE;
CREATE TABLE sbretry_source_counts (source text NOT NULL, state smallint NOT NULL, n bigint NOT NULL, PRIMARY KEY (source, state));
INSERT INTO sbretry_source_counts(source, state, n) SELECT coalesce(source, ''), state, count(*) FROM sbretry_events GROUP BY 1, 2;
`

// schemaLock is the advisory lock that serializes the schema's creation by processes starting at once
// (CREATE TABLE IF NOT EXISTS is not safe against a concurrent one).
const schemaLock = 0x5b2e7251

// Open connects to the database connString names (a pgx connection string or URL) and creates the
// tables if they are missing.
func Open(ctx context.Context, connString string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxErrorLength < 0 {
		return nil, fmt.Errorf("%w: MaxErrorLength %d is negative", retryindex.ErrInvalidOptions, o.MaxErrorLength)
	}
	if o.MaxErrorLength == 0 {
		o.MaxErrorLength = retryindex.DefaultMaxErrorLength
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		// pgx's parse errors may quote the connection string, password included.
		return nil, fmt.Errorf("%w: the connection string does not parse", retryindex.ErrInvalidOptions)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("retryindex/postgres: connecting: %w", err)
	}
	s := &Store{pool: pool, opts: o}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, schemaLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, schema); err != nil {
			return err
		}
		var missing bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('sbretry_source_counts') IS NULL`).Scan(&missing); err != nil || !missing {
			return err
		}
		_, err := tx.Exec(ctx, sourceCounts)
		return err
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("retryindex/postgres: creating the tables: %w", err)
	}
	return s, nil
}

// Close closes the connections. It is idempotent.
func (s *Store) Close() error {
	if s.closed.CompareAndSwap(false, true) {
		s.pool.Close()
	}
	return nil
}

func feedCode(feed string) int16 {
	if feed == retryindex.FeedTailer {
		return 1
	}
	return 0
}

func feedName(code int16) string {
	if code == 1 {
		return retryindex.FeedTailer
	}
	return retryindex.FeedConsumer
}

func ms(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	v := t.UnixMilli()
	return &v
}

func fromMS(v *int64) time.Time {
	if v == nil {
		return time.Time{}
	}
	return time.UnixMilli(*v).UTC()
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// write runs fn in a read-committed transaction; after Close it returns [retryindex.ErrClosed].
func (s *Store) write(ctx context.Context, fn func(pgx.Tx) error) error {
	if s.closed.Load() {
		return retryindex.ErrClosed
	}
	return pgx.BeginFunc(ctx, s.pool, fn)
}

// read runs fn in a repeatable-read, read-only transaction: one snapshot, as of asOf.
func (s *Store) read(ctx context.Context, fn func(tx pgx.Tx, asOf time.Time) error) error {
	if s.closed.Load() {
		return retryindex.ErrClosed
	}
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return fn(tx, s.opts.Now())
	})
}

// countKey is a row of sbretry_source_counts: a source entity (” for none) and a state.
type countKey struct {
	source string
	state  retryindex.State
}

// deltas are the changes of one transaction to the counts, by source entity and state.
type deltas map[countKey]int64

// add counts n more events of source in state st.
func (d deltas) add(source *string, st retryindex.State, n int64) { d[countKey{str(source), st}] += n }

// apply writes the deltas to sbretry_counts in state order, then to sbretry_source_counts in source
// and state order, so that concurrent writers take the count rows' locks in one order and never
// deadlock on them.
func (d deltas) apply(ctx context.Context, tx pgx.Tx) error {
	byState := map[retryindex.State]int64{}
	keys := make([]countKey, 0, len(d))
	for k, n := range d {
		if n != 0 {
			byState[k.state] += n
			keys = append(keys, k)
		}
	}
	states := make([]retryindex.State, 0, len(byState))
	for st, n := range byState {
		if n != 0 {
			states = append(states, st)
		}
	}
	slices.Sort(states)
	for _, st := range states {
		_, err := tx.Exec(ctx, `INSERT INTO sbretry_counts(state, n) VALUES ($1, $2) ON CONFLICT (state) DO UPDATE SET n = sbretry_counts.n + excluded.n`, int16(st), byState[st])
		if err != nil {
			return fmt.Errorf("retryindex/postgres: counting: %w", err)
		}
	}
	slices.SortFunc(keys, func(a, b countKey) int { return cmp.Or(cmp.Compare(a.source, b.source), cmp.Compare(a.state, b.state)) })
	for _, k := range keys {
		_, err := tx.Exec(ctx, `INSERT INTO sbretry_source_counts(source, state, n) VALUES ($1, $2, $3)
			ON CONFLICT (source, state) DO UPDATE SET n = sbretry_source_counts.n + excluded.n`, k.source, int16(k.state), d[k])
		if err != nil {
			return fmt.Errorf("retryindex/postgres: counting: %w", err)
		}
	}
	return nil
}

// Apply implements [retryindex.Store.Apply] by the rules of [retryindex.Record.Stage]. The records are
// written in chain order (their order per chain kept), so that two writers lock events in one order.
func (s *Store) Apply(ctx context.Context, records []retryindex.Record) error {
	for i := range records {
		if err := records[i].Validate(); err != nil {
			return err
		}
	}
	if len(records) == 0 {
		return nil
	}
	sorted := slices.Clone(records)
	slices.SortStableFunc(sorted, func(a, b retryindex.Record) int { return cmp.Compare(a.Chain, b.Chain) })
	return s.write(ctx, func(tx pgx.Tx) error {
		d := deltas{}
		feeds := map[string]bool{}
		if err := s.applyAll(ctx, tx, d, sorted); err != nil {
			return err
		}
		for i := range sorted {
			if sorted[i].Feed != retryindex.FeedTailer {
				feeds["consumer "+sorted[i].Process] = true
			}
		}
		if err := d.apply(ctx, tx); err != nil {
			return err
		}
		names := make([]string, 0, len(feeds))
		for name := range feeds {
			names = append(names, name)
		}
		slices.Sort(names)
		now := s.opts.Now().UnixMilli()
		for _, name := range names {
			if _, err := tx.Exec(ctx, `INSERT INTO sbretry_feeds(name, last) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET last = excluded.last`, name, now); err != nil {
				return fmt.Errorf("retryindex/postgres: recording the feed: %w", err)
			}
		}
		return nil
	})
}

func (s *Store) apply(ctx context.Context, tx pgx.Tx, d deltas, r *retryindex.Record) error {
	chain, _ := hex.DecodeString(r.Chain)
	state := r.State()
	pos := r.Stage()
	attempt := r.StateAttempt()
	var due *int64
	if state == retryindex.StatePending {
		due = ms(r.NextDue)
	}
	var seq *int64
	if r.SequenceNumber > 0 {
		seq = &r.SequenceNumber
	}
	entity := nullString(r.Entity)
	at := r.At.UnixMilli()
	feed := feedCode(r.Feed)
	key, corr := r.Key, r.CorrelationID
	if key == r.OriginalID {
		key = ""
	}
	if corr == r.OriginalID {
		corr = ""
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO sbretry_events(chain, original_id, key, corr, source, state, pos, attempt, due, entity, seq, updated, feed, kind)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT (chain) DO NOTHING RETURNING id`,
		chain, r.OriginalID, nullString(key), nullString(corr), nullString(r.Source), int16(state), pos, attempt, due, entity, seq, at, feed, int16(r.Kind)).Scan(&id)
	switch {
	case err == nil:
		d.add(nullString(r.Source), state, 1)
	case errors.Is(err, pgx.ErrNoRows):
		var curPos, curUpdated int64
		var curState int16
		var curEntity, curSource *string
		var curSeq *int64
		err := tx.QueryRow(ctx, `SELECT id, pos, state, updated, entity, seq, source FROM sbretry_events WHERE chain = $1 FOR UPDATE`, chain).
			Scan(&id, &curPos, &curState, &curUpdated, &curEntity, &curSeq, &curSource)
		if err != nil {
			return fmt.Errorf("retryindex/postgres: reading an event: %w", err)
		}
		if pos > curPos || (pos == curPos && at >= curUpdated) {
			if retryindex.State(curState) == state && entity == nil && seq == nil {
				entity, seq = curEntity, curSeq
			}
			_, err := tx.Exec(ctx, `UPDATE sbretry_events SET state = $1, pos = $2, attempt = $3, due = $4, entity = $5, seq = $6, updated = $7, feed = $8, kind = $9 WHERE id = $10`,
				int16(state), pos, attempt, due, entity, seq, at, feed, int16(r.Kind), id)
			if err != nil {
				return fmt.Errorf("retryindex/postgres: updating an event: %w", err)
			}
			d.add(curSource, retryindex.State(curState), -1)
			d.add(curSource, state, 1)
		}
	default:
		return fmt.Errorf("retryindex/postgres: inserting an event: %w", err)
	}
	if r.Feed == retryindex.FeedTailer {
		var seen bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sbretry_attempts WHERE event = $1 AND attempt = $2 AND kind = $3)`, id, r.Attempt, int16(r.Kind)).Scan(&seen)
		if err != nil {
			return fmt.Errorf("retryindex/postgres: reading the history: %w", err)
		}
		if seen {
			return nil
		}
	}
	var immediate *int32
	if r.Immediate != 0 {
		n := int32(r.Immediate)
		immediate = &n
	}
	_, err = tx.Exec(ctx, `INSERT INTO sbretry_attempts(event, attempt, kind, at, error, reason, next_due, process, feed, immediate)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING`,
		id, r.Attempt, int16(r.Kind), at, nullString(retryindex.RedactError(r.Error, s.opts.MaxErrorLength)), nullString(r.Reason),
		ms(r.NextDue), nullString(r.Process), feed, immediate)
	if err != nil {
		return fmt.Errorf("retryindex/postgres: adding to the history: %w", err)
	}
	return nil
}

// eventColumns are read by scanEvent, in its order; the last error and reason come from the history.
const eventColumns = `e.id, e.chain, e.original_id, e.key, e.corr, e.source, e.state, e.kind, e.attempt, e.due, e.entity, e.seq, e.updated, e.feed,
	(SELECT a.error FROM sbretry_attempts a WHERE a.event = e.id AND a.error IS NOT NULL ORDER BY a.attempt DESC, a.at DESC LIMIT 1),
	(SELECT a.reason FROM sbretry_attempts a WHERE a.event = e.id AND a.reason IS NOT NULL ORDER BY a.attempt DESC, a.at DESC LIMIT 1),
	(SELECT a.immediate FROM sbretry_attempts a WHERE a.event = e.id ORDER BY a.attempt DESC, a.at DESC LIMIT 1)`

func scanEvent(row pgx.Row) (int64, retryindex.Event, error) {
	var (
		id                        int64
		chain                     []byte
		e                         retryindex.Event
		key, corr, source, entity *string
		due, seq                  *int64
		state, feed               int16
		updated                   int64
		lastErr, reason           *string
		immediate                 *int32
		kind                      *int16
	)
	err := row.Scan(&id, &chain, &e.OriginalID, &key, &corr, &source, &state, &kind, &e.Attempt, &due, &entity, &seq, &updated, &feed, &lastErr, &reason, &immediate)
	if err != nil {
		return 0, e, err
	}
	e.Chain = hex.EncodeToString(chain)
	e.Key, e.CorrelationID = cmp.Or(str(key), e.OriginalID), cmp.Or(str(corr), e.OriginalID)
	e.Source, e.Entity = str(source), str(entity)
	e.State = retryindex.State(state)
	e.Due = fromMS(due)
	if seq != nil {
		e.SequenceNumber = *seq
	}
	e.Updated = time.UnixMilli(updated).UTC()
	e.Feed = feedName(feed)
	e.LastError, e.Reason = str(lastErr), str(reason)
	if immediate != nil {
		e.Immediate = int(*immediate)
	}
	if kind != nil {
		e.Kind = retryindex.Kind(*kind)
	}
	return id, e, nil
}

// Lookup implements [retryindex.Store.Lookup].
func (s *Store) Lookup(ctx context.Context, id string, opts *retryindex.LookupOptions) (*retryindex.Answer, error) {
	var o retryindex.LookupOptions
	if opts != nil {
		o = *opts
	}
	if o.MaxEvents < 0 || o.MaxHistory < 0 {
		return nil, fmt.Errorf("%w: negative LookupOptions bound", retryindex.ErrInvalidOptions)
	}
	o.MaxEvents, o.MaxHistory = cmp.Or(o.MaxEvents, 20), cmp.Or(o.MaxHistory, 100)
	if id == "" {
		return nil, errors.New("retryindex/postgres: empty id")
	}
	ans := &retryindex.Answer{ID: id}
	err := s.read(ctx, func(tx pgx.Tx, asOf time.Time) error {
		ans.AsOf = asOf
		chain, isCopy := retryindex.ChainOfMessageID(id)
		if !isCopy && retryindex.IsChainID(id) {
			chain, isCopy = id, true
		}
		var rows pgx.Rows
		var err error
		if isCopy {
			raw, _ := hex.DecodeString(chain)
			rows, err = tx.Query(ctx, `SELECT `+eventColumns+` FROM sbretry_events e WHERE e.chain = $1`, raw)
		} else {
			rows, err = tx.Query(ctx, `SELECT `+eventColumns+` FROM sbretry_events e WHERE e.id IN (
				SELECT id FROM sbretry_events WHERE original_id = $1 UNION SELECT id FROM sbretry_events WHERE key = $1
				UNION SELECT id FROM sbretry_events WHERE corr = $1) ORDER BY e.updated DESC, e.id DESC LIMIT $2`, id, o.MaxEvents+1)
		}
		if err != nil {
			return fmt.Errorf("retryindex/postgres: looking up: %w", err)
		}
		var ids []int64
		for rows.Next() {
			eid, e, err := scanEvent(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("retryindex/postgres: reading an event: %w", err)
			}
			ids = append(ids, eid)
			ans.Events = append(ans.Events, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("retryindex/postgres: looking up: %w", err)
		}
		if len(ans.Events) > o.MaxEvents {
			ans.Events, ids, ans.Truncated = ans.Events[:o.MaxEvents], ids[:o.MaxEvents], true
		}
		for i, eid := range ids {
			h, err := history(ctx, tx, eid, o.MaxHistory)
			if err != nil {
				return err
			}
			ans.Events[i].History = h
		}
		ans.Feeds, err = feeds(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return ans, nil
}

func history(ctx context.Context, tx pgx.Tx, event int64, limit int) ([]retryindex.Attempt, error) {
	rows, err := tx.Query(ctx, `SELECT attempt, kind, at, error, reason, next_due, process, feed, immediate FROM sbretry_attempts WHERE event = $1 ORDER BY attempt DESC, at DESC LIMIT $2`, event, limit)
	if err != nil {
		return nil, fmt.Errorf("retryindex/postgres: reading the history: %w", err)
	}
	defer rows.Close()
	var out []retryindex.Attempt
	for rows.Next() {
		var a retryindex.Attempt
		var kind, feed int16
		var at int64
		var errText, reason, process *string
		var next *int64
		var immediate *int32
		if err := rows.Scan(&a.Attempt, &kind, &at, &errText, &reason, &next, &process, &feed, &immediate); err != nil {
			return nil, fmt.Errorf("retryindex/postgres: reading the history: %w", err)
		}
		a.Kind, a.At = retryindex.Kind(kind), time.UnixMilli(at).UTC()
		a.Error, a.Reason, a.Process = str(errText), str(reason), str(process)
		a.NextDue = fromMS(next)
		a.Feed = feedName(feed)
		if immediate != nil {
			a.Immediate = int(*immediate)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("retryindex/postgres: reading the history: %w", err)
	}
	slices.Reverse(out)
	return out, nil
}

func feeds(ctx context.Context, tx pgx.Tx) ([]retryindex.FeedStatus, error) {
	rows, err := tx.Query(ctx, `SELECT name, last, cursor, lost, lost_at FROM sbretry_feeds ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("retryindex/postgres: reading the feeds: %w", err)
	}
	defer rows.Close()
	var out []retryindex.FeedStatus
	for rows.Next() {
		var f retryindex.FeedStatus
		var last int64
		var lostAt *int64
		if err := rows.Scan(&f.Name, &last, &f.Cursor, &f.Lost, &lostAt); err != nil {
			return nil, fmt.Errorf("retryindex/postgres: reading the feeds: %w", err)
		}
		f.Last = time.UnixMilli(last).UTC()
		if lostAt != nil {
			f.LostAt = time.UnixMilli(*lostAt).UTC()
		}
		out = append(out, f)
	}
	return out, rows.Err()
}

// Freshness implements [retryindex.Store.Freshness].
func (s *Store) Freshness(ctx context.Context) (*retryindex.Freshness, error) {
	var f retryindex.Freshness
	err := s.read(ctx, func(tx pgx.Tx, asOf time.Time) error {
		f.AsOf = asOf
		var err error
		f.Feeds, err = feeds(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &f, nil
}

// Pending implements [retryindex.Store.Pending] through the partial index of pending events by due
// Pending implements [retryindex.Store.Pending] through the partial index of pending events by due
// time. The cursor is the last row's due time and id.
func (s *Store) Pending(ctx context.Context, opts *retryindex.PendingOptions) (*retryindex.PendingPage, error) {
	return s.list(ctx, opts, listPending)
}

// DeadLettered implements [retryindex.Store.DeadLettered] through the partial index of dead-lettered
// events by time. The cursor is the last row's time and id.
func (s *Store) DeadLettered(ctx context.Context, opts *retryindex.PendingOptions) (*retryindex.PendingPage, error) {
	return s.list(ctx, opts, listDeadLettered)
}

// listing is one of the two listings in index order: pending by due time, earliest first, or
// dead-lettered by time, newest first.
type listing struct {
	state retryindex.State
	key   string // the column the partial index orders by
	desc  bool
}

var (
	listPending      = listing{state: retryindex.StatePending, key: "due"}
	listDeadLettered = listing{state: retryindex.StateDeadLettered, key: "updated", desc: true}
)

func (s *Store) list(ctx context.Context, opts *retryindex.PendingOptions, l listing) (*retryindex.PendingPage, error) {
	o, afterKey, afterID, err := opts.Parse(l.desc)
	if err != nil {
		return nil, err
	}
	page := &retryindex.PendingPage{}
	err = s.read(ctx, func(tx pgx.Tx, asOf time.Time) error {
		page.AsOf = asOf
		filter, args := "", []any{afterKey, afterID, o.Limit + 1, int16(l.state)}
		if o.Source != "" {
			filter, args = " AND e.source = $5", append(args, o.Source)
		}
		cmpOp, order := ">", "e."+l.key+", e.id"
		if l.desc {
			cmpOp, order = "<", "e."+l.key+" DESC, e.id DESC"
		}
		rows, err := tx.Query(ctx, `SELECT `+eventColumns+` FROM sbretry_events e
			WHERE e.state = $4 AND (e.`+l.key+`, e.id) `+cmpOp+` ($1, $2)`+filter+` ORDER BY `+order+` LIMIT $3`, args...)
		if err != nil {
			return fmt.Errorf("retryindex/postgres: listing %v: %w", l.state, err)
		}
		var last [2]int64
		for rows.Next() {
			eid, e, err := scanEvent(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("retryindex/postgres: listing %v: %w", l.state, err)
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
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("retryindex/postgres: listing %v: %w", l.state, err)
		}
		if page.Total, err = count(ctx, tx, l.state, o.Source); err != nil {
			return err
		}
		page.Feeds, err = feeds(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// count is the exact number of events in state st, of source when it is not empty, from the counts.
func count(ctx context.Context, tx pgx.Tx, st retryindex.State, source string) (int64, error) {
	var n int64
	var err error
	if source == "" {
		err = tx.QueryRow(ctx, `SELECT coalesce((SELECT n FROM sbretry_counts WHERE state = $1), 0)`, int16(st)).Scan(&n)
	} else {
		err = tx.QueryRow(ctx, `SELECT coalesce((SELECT n FROM sbretry_source_counts WHERE state = $1 AND source = $2), 0)`, int16(st), source).Scan(&n)
	}
	if err != nil {
		return 0, fmt.Errorf("retryindex/postgres: counting %v: %w", st, err)
	}
	return n, nil
}

// Counts implements [retryindex.Store.Counts] from the counts tables.
func (s *Store) Counts(ctx context.Context, opts *retryindex.CountsOptions) (*retryindex.Counts, error) {
	var o retryindex.CountsOptions
	if opts != nil {
		o = *opts
	}
	c := &retryindex.Counts{ByState: map[retryindex.State]int64{}}
	err := s.read(ctx, func(tx pgx.Tx, asOf time.Time) error {
		c.AsOf = asOf
		q, args := `SELECT state, n FROM sbretry_counts WHERE n != 0`, []any(nil)
		if o.Source != "" {
			q, args = `SELECT state, n FROM sbretry_source_counts WHERE source = $1 AND n != 0`, []any{o.Source}
		}
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("retryindex/postgres: counting: %w", err)
		}
		for rows.Next() {
			var st int16
			var n int64
			if err := rows.Scan(&st, &n); err != nil {
				rows.Close()
				return fmt.Errorf("retryindex/postgres: counting: %w", err)
			}
			c.ByState[retryindex.State(st)] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("retryindex/postgres: counting: %w", err)
		}
		c.Feeds, err = feeds(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// PendingHistogram implements [retryindex.Store.PendingHistogram] in one snapshot, through the partial
// index of pending events by due time (by source and due time for one source): the bounds are a
// lookup each, and each count a walk of the index entries it counts.
func (s *Store) PendingHistogram(ctx context.Context, opts *retryindex.HistogramOptions) (*retryindex.Histogram, error) {
	var o retryindex.HistogramOptions
	if opts != nil {
		o = *opts
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	h := &retryindex.Histogram{From: o.From, Width: o.Width}
	err := s.read(ctx, func(tx pgx.Tx, asOf time.Time) error {
		h.AsOf = asOf
		var err error
		if h.Total, err = count(ctx, tx, retryindex.StatePending, o.Source); err != nil {
			return err
		}
		// $1 is the source, or NULL for every source ($1 IS NULL is decided once, at planning).
		where := `FROM sbretry_events WHERE state = 1 AND source = $1`
		source := any(o.Source)
		if o.Source == "" {
			where, source = `FROM sbretry_events WHERE state = 1 AND $1::text IS NULL`, nil
		}
		lo, hi := o.Bounds()
		for _, b := range []struct {
			dst   *time.Time
			order string
		}{{&h.First, ""}, {&h.Last, " DESC"}} {
			var due int64
			err := tx.QueryRow(ctx, `SELECT due `+where+` AND due >= $2 AND due <= $3 ORDER BY due`+b.order+` LIMIT 1`, source, lo, hi).Scan(&due)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return fmt.Errorf("retryindex/postgres: reading the due times: %w", err)
			default:
				*b.dst = time.UnixMilli(due).UTC()
			}
		}
		n := o.Buckets()
		if n == 0 {
			return nil
		}
		err = tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE due < $2), count(*) FILTER (WHERE due > $3) `+where+` AND (due < $2 OR due > $3)`, source, lo, hi).
			Scan(&h.Before, &h.After)
		if err != nil {
			return fmt.Errorf("retryindex/postgres: counting the due times: %w", err)
		}
		h.Counts = make([]int64, n)
		rows, err := tx.Query(ctx, `SELECT (due - $2) / $4, count(*) `+where+` AND due >= $2 AND due <= $3 GROUP BY 1`, source, lo, hi, o.Width.Milliseconds())
		if err != nil {
			return fmt.Errorf("retryindex/postgres: counting the due times: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var i, k int64
			if err := rows.Scan(&i, &k); err != nil {
				return fmt.Errorf("retryindex/postgres: counting the due times: %w", err)
			}
			h.Counts[i] = k
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("retryindex/postgres: counting the due times: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Prune implements [retryindex.Store.Prune].
func (s *Store) Prune(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := s.write(ctx, func(tx pgx.Tx) error {
		cut := before.UnixMilli()
		if _, err := tx.Exec(ctx, `DELETE FROM sbretry_attempts a USING sbretry_events e WHERE a.event = e.id AND e.state IN (3, 4, 5, 6) AND e.updated < $1`, cut); err != nil {
			return fmt.Errorf("retryindex/postgres: pruning the history: %w", err)
		}
		rows, err := tx.Query(ctx, `DELETE FROM sbretry_events WHERE state IN (3, 4, 5, 6) AND updated < $1 RETURNING state, source`, cut)
		if err != nil {
			return fmt.Errorf("retryindex/postgres: pruning events: %w", err)
		}
		d := deltas{}
		for rows.Next() {
			var st int16
			var source *string
			if err := rows.Scan(&st, &source); err != nil {
				rows.Close()
				return fmt.Errorf("retryindex/postgres: pruning events: %w", err)
			}
			d.add(source, retryindex.State(st), -1)
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("retryindex/postgres: pruning events: %w", err)
		}
		return d.apply(ctx, tx)
	})
	return n, err
}

// Cursor implements [retryindex.Store.Cursor].
func (s *Store) Cursor(ctx context.Context, entity string) (int64, error) {
	if s.closed.Load() {
		return 0, retryindex.ErrClosed
	}
	var next int64
	err := s.pool.QueryRow(ctx, `SELECT cursor FROM sbretry_feeds WHERE name = $1`, "tailer "+entity).Scan(&next)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return next, err
}

// SetCursor implements [retryindex.Store.SetCursor].
func (s *Store) SetCursor(ctx context.Context, entity string, next int64, records []retryindex.Record) error {
	for i := range records {
		if err := records[i].Validate(); err != nil {
			return err
		}
	}
	sorted := slices.Clone(records)
	slices.SortStableFunc(sorted, func(a, b retryindex.Record) int { return cmp.Compare(a.Chain, b.Chain) })
	return s.write(ctx, func(tx pgx.Tx) error {
		d := deltas{}
		for i := range sorted {
			if err := s.apply(ctx, tx, d, &sorted[i]); err != nil {
				return err
			}
		}
		if err := d.apply(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO sbretry_feeds(name, last, cursor) VALUES ($1, $2, $3) ON CONFLICT (name) DO UPDATE SET last = excluded.last, cursor = excluded.cursor`,
			"tailer "+entity, s.opts.Now().UnixMilli(), next)
		if err != nil {
			return fmt.Errorf("retryindex/postgres: recording the cursor: %w", err)
		}
		return nil
	})
}

// NoteLost implements [retryindex.Store.NoteLost].
func (s *Store) NoteLost(ctx context.Context, feed string, n int64) error {
	return s.write(ctx, func(tx pgx.Tx) error {
		now := s.opts.Now().UnixMilli()
		_, err := tx.Exec(ctx, `INSERT INTO sbretry_feeds(name, last, lost, lost_at) VALUES ($1, $2, $3, $2)
			ON CONFLICT (name) DO UPDATE SET lost = sbretry_feeds.lost + excluded.lost, lost_at = excluded.lost_at`, feed, now, n)
		if err != nil {
			return fmt.Errorf("retryindex/postgres: noting lost records: %w", err)
		}
		return nil
	})
}

// ClearLost implements [retryindex.Store.ClearLost].
func (s *Store) ClearLost(ctx context.Context, before time.Time) error {
	return s.write(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE sbretry_feeds SET lost = 0, lost_at = NULL WHERE lost != 0 AND lost_at < $1`, before.UnixMilli()); err != nil {
			return fmt.Errorf("retryindex/postgres: clearing lost records: %w", err)
		}
		return nil
	})
}

// MarkGone implements [retryindex.Store.MarkGone].
func (s *Store) MarkGone(ctx context.Context, entity string, since time.Time, seen func(chain string) bool) (int64, error) {
	var n int64
	err := s.write(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, chain, attempt, state, source FROM sbretry_events WHERE state IN (1, 2) AND entity = $1 AND updated < $2 ORDER BY id FOR UPDATE`,
			entity, since.UnixMilli())
		if err != nil {
			return fmt.Errorf("retryindex/postgres: finding gone copies: %w", err)
		}
		type gone struct {
			id      int64
			attempt int
			state   int16
			source  *string
		}
		var marks []gone
		for rows.Next() {
			var g gone
			var chain []byte
			if err := rows.Scan(&g.id, &chain, &g.attempt, &g.state, &g.source); err != nil {
				rows.Close()
				return fmt.Errorf("retryindex/postgres: finding gone copies: %w", err)
			}
			if !seen(hex.EncodeToString(chain)) {
				marks = append(marks, g)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("retryindex/postgres: finding gone copies: %w", err)
		}
		now := s.opts.Now().UnixMilli()
		d := deltas{}
		for _, g := range marks {
			if _, err := tx.Exec(ctx, `UPDATE sbretry_events SET state = $1, due = NULL, updated = $2, feed = 1, kind = $4 WHERE id = $3`, int16(retryindex.StateGone), now, g.id, int16(retryindex.KindGone)); err != nil {
				return fmt.Errorf("retryindex/postgres: marking a copy gone: %w", err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO sbretry_attempts(event, attempt, kind, at, feed) VALUES ($1, $2, $3, $4, 1) ON CONFLICT DO NOTHING`, g.id, g.attempt, int16(retryindex.KindGone), now); err != nil {
				return fmt.Errorf("retryindex/postgres: marking a copy gone: %w", err)
			}
			d.add(g.source, retryindex.State(g.state), -1)
			d.add(g.source, retryindex.StateGone, 1)
		}
		n = int64(len(marks))
		return d.apply(ctx, tx)
	})
	return n, err
}
