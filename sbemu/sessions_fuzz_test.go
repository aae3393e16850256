package sbemu

import (
	"io"
	"log/slog"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

// FuzzSessionFilter feeds arbitrary AMQP values as the session filter of a
// receiver's source: parsing never panics, and a session id it accepts is
// within the Service Bus bound.
func FuzzSessionFilter(f *testing.F) {
	for _, v := range []any{nil, "session-1", "", wire.Described{Descriptor: sessionFilterCode, Value: "s"}, int64(7), []byte("x")} {
		b, err := wire.AppendValue(nil, v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, _, err := wire.DecodeValue(data)
		if err != nil {
			return
		}
		src := &wire.Source{Filter: &wire.Map{Entries: []wire.MapEntry{{Key: wire.Symbol(sessionFilterName), Value: v}}}}
		id, present, err := sessionFilter(src)
		if !present {
			t.Fatal("the filter is there")
		}
		if err == nil && id != nil && (utf8.RuneCountInString(*id) > broker.MaxSessionIDLength || !utf8.ValidString(*id)) {
			t.Fatalf("accepted session id %q", *id)
		}
	})
}

// FuzzManagementRequest sends arbitrary request bodies with each
// management operation to a session-aware queue and to a plain one: every
// request gets a reply with an int32 status, and nothing panics.
func FuzzManagementRequest(f *testing.F) {
	seeds := []struct {
		op   string
		body map[string]any
	}{
		{opReceiveBySequenceNumber, map[string]any{"sequence-numbers": []int64{1, 2}, "receiver-settle-mode": uint32(1)}},
		{opRenewSessionLock, map[string]any{"session-id": "s"}},
		{opGetSessionState, map[string]any{"session-id": "s"}},
		{opSetSessionState, map[string]any{"session-id": "s", "session-state": []byte("state")}},
		{opGetMessageSession, map[string]any{"skip": int32(0), "top": int32(100)}},
		{opGetMessageSession, map[string]any{"skip": int32(0), "top": int32(100), "last-updated-time": time.Unix(1, 0)}},
		{opGetMessageSession, map[string]any{"skip": int32(0), "top": int32(100), "last-updated-time": "yesterday"}},
		{opUpdateDisposition, map[string]any{"disposition-status": "defered", "lock-tokens": []amqp.UUID{{1}}}},
		{opPeekMessage, map[string]any{"from-sequence-number": int64(1), "message-count": int32(5)}},
	}
	for _, s := range seeds {
		b, err := (&amqp.Message{Value: s.body}).MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(s.op, b)
	}
	em, err := Start(sessionConfig())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = em.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c := &conn{em: em, id: 1 << 62, log: log}
	s := &session{c: c, log: log}
	sq, _ := em.broker.Queue("sq")
	plain, _ := em.broker.Queue("plain")
	f.Fuzz(func(t *testing.T, op string, payload []byte) {
		var req amqp.Message
		if err := req.UnmarshalBinary(payload); err != nil {
			return
		}
		if req.ApplicationProperties == nil {
			req.ApplicationProperties = map[string]any{}
		}
		req.ApplicationProperties["operation"] = op
		for _, q := range []*broker.Queue{sq, plain} {
			l := &link{s: s, queue: q, log: log}
			reply := l.handleManagement(&req)
			if _, ok := reply.ApplicationProperties[statusCodeKey].(int32); !ok {
				t.Fatalf("reply without status: %v", reply.ApplicationProperties)
			}
		}
	})
}
