package postgres

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sbretry/retry/retryindex"
)

// The recorder's common record is a first attempt's failure: a new event and its first history
// entry. Applied one by one, each costs two round trips to the server (the event's insert, then its
// history), which is what limits a recorder on Postgres (see BENCHMARKS.md); a run of them is stored
// instead with one insert of all its events, from arrays, returning their ids, and one of their
// history entries.

// applyAll applies sorted (in chain order) as [Store.apply] does one by one. Consecutive records that
// nearly always start an event (a consumer's record of a first attempt), of distinct chains, are
// gathered into a run and stored by applyNew; any other record first ends the run, so that every
// event sees its records in their order, and the rows are locked in chain order.
func (s *Store) applyAll(ctx context.Context, tx pgx.Tx, d deltas, sorted []retryindex.Record) error {
	var run []*retryindex.Record
	inRun := map[string]bool{}
	end := func() error {
		err := s.applyNew(ctx, tx, d, run)
		run = run[:0]
		clear(inRun)
		return err
	}
	for i := range sorted {
		r := &sorted[i]
		starts := r.Feed != retryindex.FeedTailer && r.Attempt <= 1
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
		if err := s.apply(ctx, tx, d, r); err != nil {
			return err
		}
	}
	return end()
}

// applyNew stores run (records of distinct chains, in chain order) as new events; a record whose
// chain already exists (the insert skipped it) is applied on its own afterwards, as any record of a
// known event is.
func (s *Store) applyNew(ctx context.Context, tx pgx.Tx, d deltas, run []*retryindex.Record) error {
	switch len(run) {
	case 0:
		return nil
	case 1:
		return s.apply(ctx, tx, d, run[0])
	}
	n := len(run)
	var (
		chains                         = make([][]byte, n)
		originals                      = make([]string, n)
		keys, corrs, sources, entities = make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		states, feeds, kinds           = make([]int16, n), make([]int16, n), make([]int16, n)
		positions, updated             = make([]int64, n), make([]int64, n)
		attempts                       = make([]int32, n)
		dues, seqs                     = make([]*int64, n), make([]*int64, n)
	)
	for i, r := range run {
		chains[i], _ = hex.DecodeString(r.Chain)
		originals[i] = r.OriginalID
		key, corr := r.Key, r.CorrelationID
		if key == r.OriginalID {
			key = ""
		}
		if corr == r.OriginalID {
			corr = ""
		}
		keys[i], corrs[i], sources[i], entities[i] = nullString(key), nullString(corr), nullString(r.Source), nullString(r.Entity)
		states[i], positions[i], attempts[i] = int16(r.State()), r.Stage(), int32(r.StateAttempt())
		if r.State() == retryindex.StatePending {
			dues[i] = ms(r.NextDue)
		}
		if r.SequenceNumber > 0 {
			seq := r.SequenceNumber
			seqs[i] = &seq
		}
		updated[i], feeds[i], kinds[i] = r.At.UnixMilli(), feedCode(r.Feed), int16(r.Kind)
	}
	rows, err := tx.Query(ctx, `INSERT INTO sbretry_events(chain, original_id, key, corr, source, state, pos, attempt, due, entity, seq, updated, feed, kind)
		SELECT * FROM unnest($1::bytea[], $2::text[], $3::text[], $4::text[], $5::text[], $6::smallint[], $7::bigint[], $8::integer[],
			$9::bigint[], $10::text[], $11::bigint[], $12::bigint[], $13::smallint[], $14::smallint[])
		ON CONFLICT (chain) DO NOTHING RETURNING id, chain`,
		chains, originals, keys, corrs, sources, states, positions, attempts, dues, entities, seqs, updated, feeds, kinds)
	if err != nil {
		return fmt.Errorf("retryindex/postgres: inserting events: %w", err)
	}
	ids := make(map[string]int64, n)
	for rows.Next() {
		var id int64
		var chain []byte
		if err := rows.Scan(&id, &chain); err != nil {
			rows.Close()
			return fmt.Errorf("retryindex/postgres: inserting events: %w", err)
		}
		ids[hex.EncodeToString(chain)] = id
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("retryindex/postgres: inserting events: %w", err)
	}
	var (
		events                        []int64
		hAttempts, hImmediate         []*int32
		hKinds, hFeeds                []int16
		hAt                           []int64
		hNext                         []*int64
		hErrors, hReasons, hProcesses []*string
		known                         []*retryindex.Record
	)
	for i, r := range run {
		id, ok := ids[r.Chain]
		if !ok {
			known = append(known, r)
			continue
		}
		d.add(sources[i], r.State(), 1)
		attempt := int32(r.Attempt)
		var immediate *int32
		if r.Immediate != 0 {
			im := int32(r.Immediate)
			immediate = &im
		}
		events, hAttempts, hImmediate = append(events, id), append(hAttempts, &attempt), append(hImmediate, immediate)
		hKinds, hFeeds, hAt, hNext = append(hKinds, int16(r.Kind)), append(hFeeds, feedCode(r.Feed)), append(hAt, r.At.UnixMilli()), append(hNext, ms(r.NextDue))
		hErrors = append(hErrors, nullString(retryindex.RedactError(r.Error, s.opts.MaxErrorLength)))
		hReasons, hProcesses = append(hReasons, nullString(r.Reason)), append(hProcesses, nullString(r.Process))
	}
	if len(events) > 0 {
		_, err := tx.Exec(ctx, `INSERT INTO sbretry_attempts(event, attempt, kind, at, error, reason, next_due, process, feed, immediate)
			SELECT * FROM unnest($1::bigint[], $2::integer[], $3::smallint[], $4::bigint[], $5::text[], $6::text[], $7::bigint[],
				$8::text[], $9::smallint[], $10::integer[])
			ON CONFLICT DO NOTHING`,
			events, hAttempts, hKinds, hAt, hErrors, hReasons, hNext, hProcesses, hFeeds, hImmediate)
		if err != nil {
			return fmt.Errorf("retryindex/postgres: adding to the history: %w", err)
		}
	}
	for _, r := range known {
		if err := s.apply(ctx, tx, d, r); err != nil {
			return err
		}
	}
	return nil
}
