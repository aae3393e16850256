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
//	O <id> <session> <index> <attempt> <seq> <pid> <ms>                    a session message's handler succeeded (fsynced)
//	D <id> <session> <index> <attempt> <reason> <pid> <ms>                 the consumer dead-lettered a session message (OnProcessed)
//
// O and D are the sessions soak's (session.go): session is the message's session id, index its place in
// the session's sequence as sent. An O record is also a success (it is added to [Log.Successes] as well),
// so that every rule over successes applies to session messages unchanged; O and D records together, in
// the order of the log, are [Log.Session], the order the session rules check.
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
	// Record is the record's place in the whole log (0 for the first line).
	Record int
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
	// Record is the record's place in the whole log (0 for the first line).
	Record int
}

// SettleFailure is an F record.
type SettleFailure struct {
	ID        string
	Attempt   int
	Operation string
	PID       int
	UnixMS    int64
}

// SessionEvent is an O or D record: a session message ended, by a success of its handler or by the
// consumer dead-lettering it.
type SessionEvent struct {
	ID      string
	Session string
	Index   int
	Attempt int
	// DeadLettered is true for a D record; Reason is then its dead-letter reason, and Seq is -1.
	DeadLettered bool
	Reason       string
	Seq          int64
	PID          int
	UnixMS       int64
	// Record is the record's place in the whole log (0 for the first line), for the evidence of a
	// violation.
	Record int
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

// SessionSuccess records the success of a session message durably, as [Writer.Success] does.
func (w *Writer) SessionSuccess(id, session string, index, attempt int, seq int64) error {
	return w.write(fmt.Sprintf("O %s %s %d %d %d %d %d\n", id, session, index, attempt, seq, w.pid, time.Now().UnixMilli()), true)
}

// SessionDeadLettered records that the consumer dead-lettered a session message with reason (which
// holds no space: the library's reasons are single words).
func (w *Writer) SessionDeadLettered(id, session string, index, attempt int, reason string) error {
	return w.write(fmt.Sprintf("D %s %s %d %d %s %d %d\n", id, session, index, attempt, reason, w.pid, time.Now().UnixMilli()), false)
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
	// Session holds the O and D records in the order of the log.
	Session []SessionEvent
	records int
}

// Add parses one line (without its newline) into l.
func (l *Log) Add(line string) error {
	f := strings.Split(line, " ")
	bad := func() error { return fmt.Errorf("ledger: malformed record %q", line) }
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	atoi64 := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
	switch {
	case len(f) == 6 && f[0] == "S":
		l.Successes = append(l.Successes, Success{ID: f[1], Attempt: atoi(f[2]), Seq: atoi64(f[3]), PID: atoi(f[4]), UnixMS: atoi64(f[5]), Record: l.records})
	case len(f) == 9 && f[0] == "P":
		l.Processed = append(l.Processed, Processed{ID: f[1], Attempt: atoi(f[2]), Seq: atoi64(f[3]), Outcome: f[4],
			Inherited: f[5] == "1", PossibleDuplicate: f[6] == "1", PID: atoi(f[7]), UnixMS: atoi64(f[8]), Record: l.records})
	case len(f) == 6 && f[0] == "F":
		l.SettleFailures = append(l.SettleFailures, SettleFailure{ID: f[1], Attempt: atoi(f[2]), Operation: f[3], PID: atoi(f[4]), UnixMS: atoi64(f[5])})
	case len(f) == 8 && f[0] == "O":
		e := SessionEvent{ID: f[1], Session: f[2], Index: atoi(f[3]), Attempt: atoi(f[4]), Seq: atoi64(f[5]), PID: atoi(f[6]), UnixMS: atoi64(f[7]), Record: l.records}
		l.Session = append(l.Session, e)
		l.Successes = append(l.Successes, Success{ID: e.ID, Attempt: e.Attempt, Seq: e.Seq, PID: e.PID, UnixMS: e.UnixMS, Record: e.Record})
	case len(f) == 8 && f[0] == "D":
		l.Session = append(l.Session, SessionEvent{ID: f[1], Session: f[2], Index: atoi(f[3]), Attempt: atoi(f[4]), DeadLettered: true,
			Reason: f[5], Seq: -1, PID: atoi(f[6]), UnixMS: atoi64(f[7]), Record: l.records})
	default:
		return bad()
	}
	l.records++
	return nil
}
