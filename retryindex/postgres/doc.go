// Package postgres is the shared backend of the retry-state index: a [retryindex.Store] in a
// PostgreSQL database (through pgx v5), for teams whose several consumers and consoles share one
// index. The embedded SQLite store (retryindex.OpenSQLite) needs no server and is the default; this
// one needs a database that the team already runs.
//
// It folds records by the same rules as the embedded store ([retryindex.Record.Stage] and friends), so
// the answers are the same; writes of several processes are serialized per event (a row lock), and
// the exact counts are kept in a table updated in the same transaction. Its tables are prefixed
// "sbretry_" so that they can live in a database shared with other applications; [Open] creates them
// if they are missing.
package postgres
