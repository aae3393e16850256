package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sbretry/retry/internal/sbtest"
)

// BenchmarkCLI10kPending times whole commands, connection set-up included, against a queue holding
// 10,000 pending retries made by a real retry.Consumer:
//
//	go test -run='^$' -bench=BenchmarkCLI10kPending -benchtime=5x ./cmd/sbretry
func BenchmarkCLI10kPending(b *testing.B) {
	const n = 10_000
	h := newHarness(b)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("pending-%d", i)
	}
	h.seed(b, ids...)
	for _, args := range [][]string{
		{"status", "pending-5000"},
		{"status", "pending-5000", "--max-peek", "20000"},
		{"pending", "--limit", "10000", "--max-peek", "20000"},
		{"pending", "--limit", "50"},
	} {
		b.Run(strings.Join(args, " "), func(b *testing.B) {
			for b.Loop() {
				var errOut bytes.Buffer
				a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now}
				code := a.run(sbtest.Context(b), append([]string{"--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue}, args...))
				if code != exitOK {
					b.Fatalf("exit %d: %s", code, errOut.String())
				}
			}
		})
	}
}
