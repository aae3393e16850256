package ledger

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The log is text, one record a line, fields separated by one space (message ids never contain one):
//
//	S <id> <attempt> <seq> <pid> <ms>                                      the handler succeeded (fsynced before it returns)
//	P <id> <attempt> <seq> <outcome> <inherited> <possible-dup> <pid> <ms>  a delivery was processed (OnProcessed)
//	F <id> <attempt> <operation> <pid> <ms>                                a settle call failed (OnSettle)
//
// id is the chain's original MessageID, attempt the envelope's, seq the delivery's sequence number, ms
// the wall-clock time in Unix milliseconds (to line records up with chaos.log and the consumer's log).
// Every line is one write(2) on a file opened with O_APPEND, so a SIGKILL leaves at most an incomplete
// last line, which [Parse] ignores.

// Success is an S record.
type Success struct {
	ID      string
	Attempt int
	Seq     int64
	PID     int
	UnixMS  int64
}

// Processed is a P record.
type Processed struct {
	ID                string
	Attempt           int
	Seq               int64
	Outcome           string
	Inherited         bool
	PossibleDuplicate bool
	PID               int
	UnixMS            int64
}

// SettleFailure is an F record.
type SettleFailure struct {
	ID        string
	Attempt   int
	Operation string
	PID       int
	UnixMS    int64
}

// Writer appends records to the log. Safe for concurrent use.
type Writer struct {
	mu  sync.Mutex
	f   *os.File
	pid int
}

// OpenWriter opens (creating if needed) the log at path for appending.
func OpenWriter(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f, pid: os.Getpid()}, nil
}

// Success records a success durably: it returns only after the line is fsynced.
func (w *Writer) Success(id string, attempt int, seq int64) error {
	return w.write(fmt.Sprintf("S %s %d %d %d %d\n", id, attempt, seq, w.pid, time.Now().UnixMilli()), true)
}

// Processed records one processed delivery (not fsynced: it survives a SIGKILL, which is what the soak
// does, though not a machine crash).
func (w *Writer) Processed(id string, attempt int, seq int64, outcome string, inherited, possibleDup bool) error {
	return w.write(fmt.Sprintf("P %s %d %d %s %s %s %d %d\n", id, attempt, seq, outcome, bit(inherited), bit(possibleDup), w.pid, time.Now().UnixMilli()), false)
}

// SettleFailed records a failed settle call.
func (w *Writer) SettleFailed(id string, attempt int, op string) error {
	return w.write(fmt.Sprintf("F %s %d %s %d %d\n", id, attempt, op, w.pid, time.Now().UnixMilli()), false)
}

// Close closes the log.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}

func (w *Writer) write(line string, sync bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.f.WriteString(line); err != nil {
		return err
	}
	if sync {
		return w.f.Sync()
	}
	return nil
}

func bit(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Log is a parsed log.
type Log struct {
	Successes      []Success
	Processed      []Processed
	SettleFailures []SettleFailure
}

// Add parses one line (without its newline) into l.
func (l *Log) Add(line string) error {
	f := strings.Split(line, " ")
	bad := func() error { return fmt.Errorf("ledger: malformed record %q", line) }
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	atoi64 := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
	switch {
	case len(f) == 6 && f[0] == "S":
		l.Successes = append(l.Successes, Success{ID: f[1], Attempt: atoi(f[2]), Seq: atoi64(f[3]), PID: atoi(f[4]), UnixMS: atoi64(f[5])})
	case len(f) == 9 && f[0] == "P":
		l.Processed = append(l.Processed, Processed{ID: f[1], Attempt: atoi(f[2]), Seq: atoi64(f[3]), Outcome: f[4],
			Inherited: f[5] == "1", PossibleDuplicate: f[6] == "1", PID: atoi(f[7]), UnixMS: atoi64(f[8])})
	case len(f) == 6 && f[0] == "F":
		l.SettleFailures = append(l.SettleFailures, SettleFailure{ID: f[1], Attempt: atoi(f[2]), Operation: f[3], PID: atoi(f[4]), UnixMS: atoi64(f[5])})
	default:
		return bad()
	}
	return nil
}
