package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryindex"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// benchEmulator starts an emulator with the queues names and a client on it.
func benchEmulator(b *testing.B, names []string) (*sbemu.Emulator, *azservicebus.Client) {
	b.Helper()
	qs := make([]broker.QueueConfig, len(names))
	for i, n := range names {
		qs[i] = broker.QueueConfig{Name: n}
	}
	em, err := sbemu.Start(sbemu.Config{Queues: qs})
	require.NoError(b, err)
	b.Cleanup(func() { _ = em.Close() })
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(b, err)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), sbtest.Timeout)
		defer cancel()
		_ = client.Close(ctx)
	})
	return em, client
}

// fill sends active messages to queue through the SDK, then dead-letters dead of them in the broker
// directly (receiving and dead-lettering 10,000 messages over AMQP would only slow the set-up), with
// last errors that fall into groups failure groups and differ in their numbers.
func fill(b *testing.B, em *sbemu.Emulator, client *azservicebus.Client, queue string, active, dead, groups int) {
	b.Helper()
	h := &sbtest.Harness{Em: em, Client: client}
	msgs := make([]*azservicebus.Message, active+dead)
	for i := range msgs {
		msgs[i] = sbtest.Message(fmt.Sprintf("%s-%d", queue, i))
	}
	h.SendToEntity(b, queue, msgs...)
	q, ok := em.Broker().Queue(queue)
	require.True(b, ok)
	for i := range dead {
		d, ok := q.TryReceive(broker.PeekLock, 0)
		require.True(b, ok)
		lastErr := fmt.Sprintf("failure kind %d: order %d rejected after %dms (trace 0x%x)", i%groups, i, 100+i%900, i*7919)
		require.NoError(b, q.DeadLetter(d.LockToken, "RetryMaxAttemptsExceeded", "", map[string]any{"sbretry-last-error": lastErr}))
	}
}

// get serves one request on c and fails b unless it is 200.
func get(b *testing.B, c *Console, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		b.Fatalf("%s: %d %s", path, rec.Code, rec.Body.String())
	}
	return rec
}

// BenchmarkOverview20Entities renders the overview of 20 queues, each with 200 active messages and 50
// dead letters, on the emulator through the SDK:
//
//	go test -run='^$' -bench=BenchmarkOverview20Entities -benchtime=20x ./console
//
// "poll" reads every entity (what the page costs when it has no sample, and what each poll of Run
// costs); "from the ring" is the page once Run has polled.
func BenchmarkOverview20Entities(b *testing.B) {
	names := make([]string, 20)
	for i := range names {
		names[i] = fmt.Sprintf("queue-%02d", i)
	}
	em, client := benchEmulator(b, names)
	entities := make([]Entity, len(names))
	for i, n := range names {
		fill(b, em, client, n, 200, 50, 3)
		entities[i] = Entity{Path: n}
	}
	c, err := New(client, entities, nil)
	require.NoError(b, err)
	b.Run("poll", func(b *testing.B) {
		for b.Loop() {
			c.ring = newRing(2)
			get(b, c, "/")
		}
		b.ReportMetric(float64(len(names)*(200+50)), "peeked/op")
	})
	b.Run("from the ring", func(b *testing.B) {
		get(b, c, "/")
		for b.Loop() {
			get(b, c, "/")
		}
	})
}

var benchGroupLink = regexp.MustCompile(`data-group="([0-9a-f]+)"`)

// BenchmarkGroupPage10k renders the dead-letter groups and the largest group's page of a queue holding
// 10,000 dead letters in 4 failure groups, and the preview of redriving that whole group:
//
//	go test -run='^$' -bench=BenchmarkGroupPage10k -benchtime=10x ./console
//
// Every page peeks the whole dead-letter queue (up to MaxPeek), because Service Bus can only be read
// in sequence order: grouping needs every message's last error.
func BenchmarkGroupPage10k(b *testing.B) {
	const n = 10_000
	em, client := benchEmulator(b, []string{"orders"})
	fill(b, em, client, "orders", 0, n, 4)
	for _, bc := range []struct {
		name    string
		maxPeek int
	}{{"MaxPeek 10000", 0}, {"MaxPeek 2000", 2000}} {
		c, err := New(client, []Entity{{Path: "orders"}}, &Options{MaxPeek: bc.maxPeek})
		require.NoError(b, err)
		page := get(b, c, "/deadletters?e=orders").Body.String()
		m := benchGroupLink.FindStringSubmatch(page)
		require.NotNil(b, m)
		group := "/group?e=orders&g=" + m[1]
		b.Run("dead letters/"+bc.name, func(b *testing.B) {
			for b.Loop() {
				get(b, c, "/deadletters?e=orders")
			}
		})
		b.Run("group page/"+bc.name, func(b *testing.B) {
			var size int
			for b.Loop() {
				size = get(b, c, group).Body.Len()
			}
			b.ReportMetric(float64(size), "bytes/page")
		})
		b.Run("group redrive preview/"+bc.name, func(b *testing.B) {
			srv := httptest.NewServer(c)
			defer srv.Close()
			jar, err := cookiejar.New(nil)
			require.NoError(b, err)
			s := &site{c: c, srv: srv, client: &http.Client{Jar: jar, Timeout: time.Minute}}
			form := url.Values{"action": {"redrive"}, "g": {m[1]}, "e": {"orders"}, "csrf": {s.token(b, "/")}}
			for b.Loop() {
				code, body := s.post(b, "/action/preview", form)
				if code != http.StatusOK {
					b.Fatalf("preview: %d %s", code, body)
				}
			}
		})
	}
}

// BenchmarkSearchFromIndex times one search page answered from an index of 100,000 pending retries
// (issue 33's "type an id, see will be retried at …"): a lookup by original id of a random event, its
// history, and the page's rendering, through the handler (no network).
func BenchmarkSearchFromIndex(b *testing.B) {
	const events = 100_000
	_, client := benchEmulator(b, []string{"orders"})
	store, err := retryindex.OpenSQLite(filepath.Join(b.TempDir(), "index.db"), nil)
	require.NoError(b, err)
	b.Cleanup(func() { _ = store.Close() })
	at := time.Now()
	batch := make([]retryindex.Record, 0, 1000)
	for i := range events {
		r := recordOf(fmt.Sprintf("order-%d", i), int64(i+1), "orders")
		r.Kind, r.Attempt, r.NextAttempt, r.At, r.NextDue = retryindex.KindScheduled, 1, 2, at, at.Add(time.Duration(i)*time.Second)
		r.Error, r.Entity, r.SequenceNumber = "ledger unavailable", "orders", int64(i+1)
		batch = append(batch, r)
		if len(batch) == cap(batch) {
			require.NoError(b, store.Apply(context.Background(), batch))
			batch = batch[:0]
		}
	}
	c, err := New(client, []Entity{{Path: "orders", MaxAttempts: 5}}, &Options{Index: store})
	require.NoError(b, err)
	answer := regexp.MustCompile(`Will be retried at [^,]+, attempt 2 of 5`)
	b.ResetTimer()
	for i := range b.N {
		req := httptest.NewRequest(http.MethodGet, "/search?q=order-"+itoa(i*7919%events), nil)
		req.Host = "localhost"
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !answer.MatchString(rec.Body.String()) {
			b.Fatalf("status %d: %.300s", rec.Code, rec.Body.String())
		}
	}
}

// BenchmarkActOnAllMatching measures the filtered dead-letter page and a redrive of all matching on a
// queue holding 4,000 dead letters in 4 failure groups, of which the filter (an error text) matches
// 1,000: the page, the preview (which reads the dead-letter queue and lists the 1,000 refs), and the
// run in batches of 100 (which reads them again, checks the digest, and resubmits and completes each):
//
//	go test -run='^$' -bench=BenchmarkActOnAllMatching -benchtime=3x ./console
//
// Measured on the in-process emulator (2 cores, AMD EPYC): the page 0.12 s, the preview 0.17 s, the
// run of 1,000 redrives in 10 batches 0.58 s.
func BenchmarkActOnAllMatching(b *testing.B) {
	const n, matching = 4000, 1000
	em, client := benchEmulator(b, []string{sbtest.Queue})
	h := &sbtest.Harness{Em: em, Client: client, Entity: sbtest.Queue, SendTo: sbtest.Queue}
	c, err := New(client, entitiesOf(h), &Options{BatchSize: 100})
	require.NoError(b, err)
	s := serve(b, h, c)
	filter := url.Values{"error": {"failure kind 1:"}}
	var page, preview, run time.Duration
	for b.Loop() {
		b.StopTimer()
		fill(b, em, client, sbtest.Queue, 0, n, 4)
		b.StartTimer()
		start := time.Now()
		code, body := s.get(b, "/deadletters?e=orders&"+filter.Encode())
		require.Equal(b, http.StatusOK, code)
		require.Contains(b, body, fmt.Sprintf("%d dead letters match", matching))
		page += time.Since(start)

		start = time.Now()
		form := url.Values{"csrf": {s.token(b, "/")}, "e": {"orders"}, "action": {"redrive"}, "match": {"1"}, "error": filter["error"]}
		code, body = s.post(b, "/action/preview", form)
		require.Equal(b, http.StatusOK, code)
		preview += time.Since(start)
		refs := refPattern.FindAllStringSubmatch(body, -1)
		require.Len(b, refs, matching)
		run1 := url.Values{"csrf": {s.token(b, "/")}, "e": {"orders"}, "action": {"redrive"},
			"digest": {digestPattern.FindStringSubmatch(body)[1]}, "matched": {"error contains failure kind 1:"}}
		for _, m := range refs {
			run1.Add("ref", unescape(m[1]))
		}
		start = time.Now()
		code, body = s.post(b, "/action/run", run1)
		require.Equal(b, http.StatusOK, code)
		require.Contains(b, body, fmt.Sprintf("Resubmitted %d of %d", matching, matching))
		run += time.Since(start)

		b.StopTimer()
		// The rest of the dead letters and the fresh deliveries go, for the next round.
		q, _ := em.Broker().Queue(sbtest.Queue)
		dlq, _ := em.Broker().Queue(sbtest.Queue + "/$DeadLetterQueue")
		for _, qq := range []*broker.Queue{q, dlq} {
			if qq == nil {
				continue
			}
			for {
				d, ok := qq.TryReceive(broker.PeekLock, 0)
				if !ok {
					break
				}
				require.NoError(b, qq.Complete(d.LockToken))
			}
		}
		b.StartTimer()
	}
	iters := float64(b.N)
	b.ReportMetric(page.Seconds()/iters, "page-s/op")
	b.ReportMetric(preview.Seconds()/iters, "preview-s/op")
	b.ReportMetric(run.Seconds()/iters, "run-s/op")
}
