package broker

import (
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// storedSamples are messages of the shapes the broker stores, encoded.
func storedSamples(t testing.TB) [][]byte {
	s := func(v string) *string { return &v }
	msgs := []*amqp.Message{
		fullMessage(),
		{},
		{Data: [][]byte{[]byte("body")}},
		{Header: &amqp.MessageHeader{TTL: 90 * time.Minute}, Properties: &amqp.MessageProperties{MessageID: "id", GroupID: s("session-1")}},
		{Header: &amqp.MessageHeader{TTL: 2 * time.Millisecond}, Value: []any{int64(1), "x", nil, []string{"a", "b"}}},
		{Annotations: amqp.Annotations{AnnotationScheduledEnqueueTime: time.UnixMilli(1700000000000), "x-opt-partition-key": "p"},
			ApplicationProperties: map[string]any{"n": int64(3), "f": 1.5, "b": true, "u": amqp.UUID{1}, "big": make([]byte, 300)}},
		{Properties: &amqp.MessageProperties{GroupID: s("")}, Data: [][]byte{make([]byte, 70000)}},
	}
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		data, err := m.MarshalBinary()
		require.NoError(t, err)
		out[i] = data
	}
	return out
}

// TestCheckStoredAcceptsWhatTheBrokerWrites: every encoding go-amqp
// writes passes, with the session id and time-to-live a decoding gives.
func TestCheckStoredAcceptsWhatTheBrokerWrites(t *testing.T) {
	for i, data := range storedSamples(t) {
		session, err := checkStored(data)
		require.NoError(t, err, "sample %d", i)
		var m amqp.Message
		require.NoError(t, m.UnmarshalBinary(data))
		assert.Equal(t, sessionID(&m), session, "sample %d", i)
		assert.Equal(t, headerTTL(&m), storedTTL(data), "sample %d", i)
	}
}

// TestCheckStoredRefusesDamage: bytes cut short, a section that is not
// one and a type go-amqp cannot decode are refused.
func TestCheckStoredRefusesDamage(t *testing.T) {
	full, err := fullMessage().MarshalBinary()
	require.NoError(t, err)
	for name, data := range map[string][]byte{
		"cut short":             full[:len(full)-1],
		"no section descriptor": {0x40},
		"unknown section":       {0x00, 0x53, 0x79, 0x40},
		"unknown type":          {0x00, 0x53, 0x77, 0xff},
		"decimal32":             {0x00, 0x53, 0x77, 0x74, 0, 0, 0, 0},
		"data not binary":       {0x00, 0x53, 0x75, 0xa1, 0x01, 'x'},
		"property key a symbol": {0x00, 0x53, 0x74, 0xc1, 0x05, 0x02, 0xa3, 0x01, 'k', 0x40},
		"map of odd count":      {0x00, 0x53, 0x74, 0xc1, 0x04, 0x01, 0xa1, 0x01, 'k'},
		"list count too large":  {0x00, 0x53, 0x77, 0xc0, 0x02, 0x05, 0x40},
		"header of wrong types": {0x00, 0x53, 0x70, 0xc0, 0x03, 0x01, 0xa1, 0x00},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := checkStored(data)
			assert.Error(t, err)
		})
	}
}

// FuzzCheckStored: whatever checkStored accepts, go-amqp decodes, with
// the same session id and time-to-live, so a message restored without
// being decoded always decodes when it is delivered (entry.message).
func FuzzCheckStored(f *testing.F) {
	for _, data := range storedSamples(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		session, err := checkStored(data)
		if err != nil {
			return
		}
		var m amqp.Message
		if err := m.UnmarshalBinary(data); err != nil {
			t.Fatalf("checkStored accepted % x, which go-amqp refuses: %v", data, err)
		}
		if got := sessionID(&m); got != session {
			t.Fatalf("session id %q, decoded %q", session, got)
		}
		if got, want := storedTTL(data), headerTTL(&m); got != want {
			t.Fatalf("time-to-live %v, decoded %v", got, want)
		}
	})
}

// TestSendRefusesAMessageWithoutAnEncoding: the broker stores a message
// encoded, so one handed to it directly with a value AMQP cannot carry is
// refused at the send, and nothing is stored.
func TestSendRefusesAMessageWithoutAnEncoding(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	odd := &amqp.Message{Data: [][]byte{[]byte("x")}, ApplicationProperties: map[string]any{"odd": struct{ A int }{1}}}
	_, _, err := q.Send(odd, 10)
	require.Error(t, err)
	assert.Empty(t, q.Peek(1, 10))
}

// TestRewriteKeepsTheMessageOnFailure: a change that cannot be encoded
// (an abandon's property of no AMQP type, handed to the broker directly)
// fails the call and leaves the stored message and its lock as they were.
func TestRewriteKeepsTheMessageOnFailure(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	mustSend(t, q, newMsg("id", "body"))
	d := mustReceive(t, q, PeekLock)
	require.Error(t, q.Abandon(d.LockToken, map[any]any{"odd": struct{ A int }{1}}))
	require.NoError(t, q.Abandon(d.LockToken, map[any]any{"fine": "yes"}), "the lock is still held")
	again := mustReceive(t, q, PeekLock)
	assert.Equal(t, "body", body(again))
	assert.Equal(t, map[string]any{"fine": "yes"}, again.Message.ApplicationProperties)
}

// TestDeadLetterRefusesPropertiesWithoutAnEncoding: dead-letter
// properties AMQP cannot carry fail the call before anything moves; the
// lock stays held and the message where it was.
func TestDeadLetterRefusesPropertiesWithoutAnEncoding(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	mustSend(t, q, newMsg("id", "body"))
	d := mustReceive(t, q, PeekLock)
	require.Error(t, q.DeadLetter(d.LockToken, "reason", "", map[string]any{"odd": struct{ A int }{1}}))
	require.NoError(t, q.DeadLetter(d.LockToken, "reason", "", map[string]any{"fine": "yes"}), "the lock is still held")
	dlq := q.b.queues["q"].dlq
	dead := mustReceive(t, dlq, ReceiveAndDelete)
	assert.Equal(t, "yes", dead.Message.ApplicationProperties["fine"])
	assert.Equal(t, uint32(0), dead.Message.Header.DeliveryCount, "the failed call did not count")
}
