package main

import (
	"fmt"
	"io"
	"os"
)

// progress reports bulk work on stderr: on a terminal one line rewritten in place, elsewhere (a log, a
// pipe, a test) a line at every tenth of the work and at the end, so logs stay short.
type progress struct {
	w        io.Writer
	verb     string
	total    int
	terminal bool
	lastStep int
}

func newProgress(w io.Writer, verb string, total int) *progress {
	p := &progress{w: w, verb: verb, total: total}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.terminal = true
		}
	}
	return p
}

// update reports that done of total items are finished.
func (p *progress) update(done int) {
	if p.terminal {
		fmt.Fprintf(p.w, "\r%s %d/%d", p.verb, done, p.total)
		if done == p.total {
			fmt.Fprintln(p.w)
		}
		return
	}
	step := done * 10 / max(p.total, 1)
	if step > p.lastStep || done == p.total {
		p.lastStep = step
		fmt.Fprintf(p.w, "sbretry: %s %d/%d\n", p.verb, done, p.total)
	}
}

// stop ends an interrupted terminal line.
func (p *progress) stop(done int) {
	if p.terminal && done < p.total {
		fmt.Fprintln(p.w)
	}
}
