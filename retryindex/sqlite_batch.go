package retryindex

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
)

// The recorder's common record is a first attempt's failure: a new event and its first history
// entry. Stored one statement each, the driver's per-statement work (arguments converted, a statement
// reset and run) is paid per record, so a run of new events is stored with multi-row statements
// instead: one INSERT of up to 64 events, whose ids follow from the insert, then one of their history
// entries (measured in BenchmarkWriterBatch; see BENCHMARKS.md).

// rowChunks are the sizes of the multi-row statements, largest first: a run of n new events is
// stored in as few statements as these sizes add up to.
var rowChunks = [...]int{64, 16, 4, 1}

// batchStmts are the multi-row statements, by rows, prepared once on the write connection.
type batchStmts struct {
	events, attempts map[int]*sql.Stmt
}

const (
	eventInsertHead   = `INSERT OR IGNORE INTO events(chain, original_id, key, corr, source, state, pos, attempt, due, entity, seq, updated, feed, kind) VALUES `
	eventRowParams    = `(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	attemptInsertHead = `INSERT OR IGNORE INTO attempts(event, attempt, kind, at, error, reason, next_due, process, feed, immediate) VALUES `
	attemptRowParams  = `(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	attemptColumns    = 10
)

// rowsOf is the statement head followed by n rows of placeholders.
func rowsOf(head, row string, n int) string {
	return head + strings.Repeat(row+", ", n-1) + row
}

func (b *batchStmts) prepare(db *sql.DB) error {
	b.events, b.attempts = map[int]*sql.Stmt{}, map[int]*sql.Stmt{}
	for _, n := range rowChunks {
		ev, err := db.Prepare(rowsOf(eventInsertHead, eventRowParams, n))
		if err != nil {
			return err
		}
		b.events[n] = ev
		at, err := db.Prepare(rowsOf(attemptInsertHead, attemptRowParams, n))
		if err != nil {
			return err
		}
		b.attempts[n] = at
	}
	return nil
}

// chunk is the largest of rowChunks no larger than n (n > 0).
func chunk(n int) int {
	for _, c := range rowChunks {
		if c <= n {
			return c
		}
	}
	return 1
}

// applyAll applies records in order. Consecutive records that nearly always start an event (a
// consumer's record of a first attempt) are gathered into a run of distinct chains and stored by
// applyNew; any other record, or a second record of a chain in the run, first ends the run, so that
// every event sees its records in their order.
// stop ends the transaction between records (ctx, without an end, runs the statements).
func (s *SQLite) applyAll(stop, ctx context.Context, tx *sql.Tx, st *txStmts, deltas countDeltas, records []Record) error {
	var run []*Record
	inRun := map[string]bool{}
	end := func() error {
		err := s.applyNew(ctx, tx, st, deltas, run)
		run = run[:0]
		clear(inRun)
		return err
	}
	for i := range records {
		if err := stop.Err(); err != nil {
			return err
		}
		r := &records[i]
		starts := r.Feed != FeedTailer && r.Attempt <= 1
		if starts && !inRun[r.Chain] {
			run, inRun[r.Chain] = append(run, r), true
			continue
		}
		if err := end(); err != nil {
			return err
		}
		if starts {
			run, inRun[r.Chain] = append(run, r), true
			continue
		}
		if err := s.apply(ctx, tx, st, deltas, r); err != nil {
			return err
		}
	}
	return end()
}

// applyNew stores run (records of distinct chains) as new events with multi-row inserts; a record
// whose chain already exists (the insert ignored it) is applied on its own afterwards, as any record
// of a known event is.
func (s *SQLite) applyNew(ctx context.Context, tx *sql.Tx, st *txStmts, deltas countDeltas, run []*Record) error {
	var known []*Record
	for len(run) > 0 {
		n := chunk(len(run))
		part := run[:n]
		run = run[n:]
		args := make([]any, 0, n*14)
		for _, r := range part {
			row, err := s.eventRow(ctx, tx, r)
			if err != nil {
				return err
			}
			args = append(args, row...)
		}
		ids, err := s.insertEvents(ctx, tx, part, args)
		if err != nil {
			return err
		}
		var history []any
		for _, r := range part {
			id, ok := ids[r.Chain]
			if !ok {
				known = append(known, r)
				continue
			}
			source, err := s.nameID(ctx, tx, r.Source) // interned by eventRow: read from the cache
			if err != nil {
				return err
			}
			deltas.add(source, stateOf(r.Kind), 1)
			row, err := s.attemptRow(ctx, tx, id, r)
			if err != nil {
				return err
			}
			history = append(history, row...)
		}
		for len(history) > 0 {
			k := chunk(len(history) / attemptColumns)
			if _, err := tx.StmtContext(ctx, s.batch.attempts[k]).ExecContext(ctx, history[:k*attemptColumns]...); err != nil {
				return fmt.Errorf("retryindex: adding to the history: %w", err)
			}
			history = history[k*attemptColumns:]
		}
	}
	for _, r := range known {
		if err := s.apply(ctx, tx, st, deltas, r); err != nil {
			return err
		}
	}
	return nil
}

// insertEvents runs the multi-row insert of the events part starts and returns the ids of those it
// inserted, by chain. The ids come from the insert itself: in one write transaction SQLite gives
// the rows of one INSERT consecutive rowids in the order of its VALUES (one more than the largest
// each time), so when every row was inserted they are the last n ids. When some chain already
// existed (the insert ignored its row), the ids are read back; only those above the ones that
// existed before are this insert's. (RETURNING gave the ids too, at a fifth of the writer's CPU.)
func (s *SQLite) insertEvents(ctx context.Context, tx *sql.Tx, part []*Record, args []any) (map[string]int64, error) {
	n := len(part)
	res, err := tx.StmtContext(ctx, s.batch.events[n]).ExecContext(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("retryindex: inserting events: %w", err)
	}
	inserted, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("retryindex: inserting events: %w", err)
	}
	last, err := res.LastInsertId()
	if err != nil {
		return nil, fmt.Errorf("retryindex: inserting events: %w", err)
	}
	ids := make(map[string]int64, n)
	if inserted == int64(n) {
		for i, r := range part {
			ids[r.Chain] = last - int64(n-1-i)
		}
		return ids, nil
	}
	first := last - inserted + 1 // this insert's ids are first..last
	for _, r := range part {
		chain, _ := hex.DecodeString(r.Chain)
		var id int64
		if err := tx.StmtContext(ctx, s.stmts.selectID).QueryRowContext(ctx, chain).Scan(&id); err != nil {
			return nil, fmt.Errorf("retryindex: reading an event: %w", err)
		}
		if inserted > 0 && id >= first && id <= last {
			ids[r.Chain] = id
		}
	}
	return ids, nil
}
