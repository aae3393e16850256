package ledger

import (
	"bytes"
	"io"
	"os"
)

// Tail reads a log that another process is still appending to: each Read returns the records that were
// completed since the last one. An incomplete last line is kept for the next Read.
type Tail struct {
	path    string
	offset  int64
	partial []byte
	log     Log
}

// NewTail follows the log at path from its beginning; the file need not exist yet.
func NewTail(path string) *Tail { return &Tail{path: path} }

// Read parses what was appended since the last Read and returns how many records it added. A malformed
// complete line is an error.
func (t *Tail) Read() (int, error) {
	f, err := os.Open(t.path)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if _, err := f.Seek(t.offset, io.SeekStart); err != nil {
		return 0, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return 0, err
	}
	t.offset += int64(len(data))
	data = append(t.partial, data...)
	n := 0
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		if err := t.log.Add(string(data[:i])); err != nil {
			t.partial = nil
			return n, err
		}
		n++
		data = data[i+1:]
	}
	t.partial = append([]byte(nil), data...)
	return n, nil
}

// Log is everything read so far.
func (t *Tail) Log() *Log { return &t.log }

// Partial reports whether the file ends in an incomplete line (a record cut by a SIGKILL).
func (t *Tail) Partial() bool { return len(t.partial) > 0 }
