package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sbretry/retry/internal/redact"
	"github.com/sbretry/retry/retryindex"
)

// indexFeed runs "index rebuild" and "index tail": the broker's feed of a retry-state index
// (retryindex.Tailer). A rebuild reads the entity and its dead-letter queue from their first message,
// which is how an index whose recorder lost records (its answers say so) is repaired; tail keeps an
// index fed from the broker alone, reading what arrived since its last read. Neither is bounded by
// --timeout unless it is given: a rebuild reads the whole backlog, and tail runs until interrupted
// (or for --timeout).
func (a *app) indexFeed(ctx context.Context, name string, args []string) error {
	var c common
	fs := newFlagSet(name, &c)
	index := fs.String("index", "", "")
	interval := fs.Duration("interval", 10*time.Second, "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("%s takes no arguments", name)
	case *index == "":
		return usagef("%s needs --index FILE (an index file, created if missing) or a postgres:// URL", name)
	case c.sessionConsumer:
		return usagef("%s reads retry copies and dead letters; a session consumer keeps its holds in its sessions, which the tailer does not read", name)
	case name == "index tail" && *interval <= 0:
		return usagef("--interval must be positive")
	case name == "index tail" && c.json:
		return usagef("index tail writes its progress as lines on stderr; --json is for index rebuild")
	}
	timed := false
	fs.Visit(func(f *flag.Flag) { timed = timed || f.Name == "timeout" })
	if !timed {
		c.timeout = unbounded
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	store, where, err := openIndexFor(ctx, *index, true)
	if err != nil {
		return err
	}
	defer store.Close()
	opts := &retryindex.TailerOptions{RetryQueue: c.retryQueue, PeekBatchSize: min(c.maxPeek, 250), Process: "sbretry",
		OnPoll: func(res retryindex.TailResult) {
			if res.Recorded > 0 {
				fmt.Fprintf(a.stderr, "sbretry: %s; %d records written\n", describePeeked(res.Peeked), res.Recorded)
			}
		}}
	t, err := retryindex.NewTailer(s.client, store, s.entity.Path(), opts)
	if err != nil {
		return usagef("%v", err)
	}
	if name == "index rebuild" {
		return a.rebuildIndex(ctx, &c, t, where)
	}
	// The first read is the command's own: a wrong entity, a refused credential or an index that
	// cannot be written fails the command at once. Later failures are reported and tried again.
	first, err := t.Poll(ctx)
	if err != nil {
		return fmt.Errorf("reading %s into index %s: %w", strings.Join(t.Entities(), " and "), where, err)
	}
	opts.OnPoll(first)
	fmt.Fprintf(a.stderr, "sbretry: feeding index %s from %s every %v; interrupt to stop\n", where, strings.Join(t.Entities(), " and "), *interval)
	err = t.Run(ctx, *interval, func(err error) {
		fmt.Fprintf(a.stderr, "sbretry: a read into the index failed (tried again in %v): %s\n", *interval, redact.String(err.Error()))
	})
	if ctx.Err() != nil {
		return nil // interrupted, or --timeout passed: the way tail ends
	}
	return err
}

// unbounded stands for "no --timeout" where a command is not bounded by default (about 100 years).
const unbounded = 100 * 365 * 24 * time.Hour

// rebuildIndex runs t's rebuild and says what it read and wrote.
func (a *app) rebuildIndex(ctx context.Context, c *common, t *retryindex.Tailer, where string) error {
	start := time.Now()
	res, err := t.Rebuild(ctx)
	if err != nil {
		return fmt.Errorf("rebuilding index %s from the broker (what was read so far is stored): %w", where, err)
	}
	took := time.Since(start)
	if c.json {
		return writeJSON(a.stdout, struct {
			Index         string         `json:"index"`
			TookMs        int64          `json:"tookMs"`
			Peeked        map[string]int `json:"peeked"`
			Recorded      int            `json:"recorded"`
			Gone          int64          `json:"gone"`
			LossesCleared bool           `json:"lossesCleared"`
		}{where, took.Milliseconds(), res.Peeked, res.Recorded, res.Gone, true})
	}
	fmt.Fprintf(a.stdout, "rebuilt index %s from the broker in %v: %s; %d records written, %d events marked gone (their copy is no longer in %s); losses noted before the rebuild cleared\n",
		where, took.Round(time.Millisecond), describePeeked(res.Peeked), res.Recorded, res.Gone, t.Entities()[0])
	return nil
}

// describePeeked says how many messages were read from each entity, in the order of their paths.
func describePeeked(peeked map[string]int) string {
	paths := make([]string, 0, len(peeked))
	for p := range peeked {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	parts := make([]string, len(paths))
	for i, p := range paths {
		noun := "messages"
		if peeked[p] == 1 {
			noun = "message"
		}
		parts[i] = fmt.Sprintf("read %d %s of %s", peeked[p], noun, p)
	}
	if len(parts) == 0 {
		return "read nothing"
	}
	return strings.Join(parts, ", ")
}
