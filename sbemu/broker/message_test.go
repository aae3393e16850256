package broker

import (
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fullMessage() *amqp.Message {
	s := func(v string) *string { return &v }
	now := time.Unix(100, 0)
	gs := uint32(3)
	return &amqp.Message{
		Format:              1,
		DeliveryTag:         []byte{1},
		Header:              &amqp.MessageHeader{Durable: true, TTL: time.Second, DeliveryCount: 2},
		DeliveryAnnotations: amqp.Annotations{"da": []byte{2}},
		Annotations:         amqp.Annotations{"a": map[string]any{"nested": []byte{3}}},
		Properties: &amqp.MessageProperties{
			MessageID: []byte{4}, CorrelationID: "c", UserID: []byte{5}, To: s("to"), Subject: s("subj"),
			ReplyTo: s("rt"), ContentType: s("ct"), ContentEncoding: s("ce"), AbsoluteExpiryTime: &now,
			CreationTime: &now, GroupID: s("g"), GroupSequence: &gs, ReplyToGroupID: s("rg"),
		},
		ApplicationProperties: map[string]any{"p": []any{[]byte{6}, map[any]any{"k": []byte{7}}}},
		Data:                  [][]byte{{8}, {9}},
		Value:                 map[amqp.Symbol]any{"v": []byte{10}},
		Sequence:              [][]any{{[]byte{11}}},
		Footer:                amqp.Annotations{"f": [][]byte{{12}}},
	}
}

// mutate changes every mutable part of m in place.
func mutate(m *amqp.Message) {
	if m.DeliveryTag != nil { // not part of the encoding: absent from a delivery
		m.DeliveryTag[0] = 99
	}
	m.Header.DeliveryCount = 99
	m.DeliveryAnnotations["da"].([]byte)[0] = 99
	m.Annotations["a"].(map[string]any)["nested"].([]byte)[0] = 99
	m.Annotations["new"] = 1
	m.Properties.MessageID.([]byte)[0] = 99
	m.Properties.UserID[0] = 99
	*m.Properties.To = "x"
	*m.Properties.GroupSequence = 99
	m.ApplicationProperties["p"].([]any)[0].([]byte)[0] = 99
	m.ApplicationProperties["p"].([]any)[1].(map[any]any)["k"].([]byte)[0] = 99
	m.Data[0][0] = 99
	m.Value.(map[amqp.Symbol]any)["v"].([]byte)[0] = 99
	m.Sequence[0][0].([]byte)[0] = 99
	m.Footer["f"].([][]byte)[0][0] = 99
}

func TestCopyMessageIsDeep(t *testing.T) {
	orig := fullMessage()
	c := CopyMessage(orig)
	require.Equal(t, fullMessage(), c)
	mutate(c)
	assert.Equal(t, fullMessage(), orig, "mutating the copy left the original alone")
	assert.Nil(t, CopyMessage(nil))
	assert.Equal(t, &amqp.Message{}, CopyMessage(&amqp.Message{}))
}

func TestDeliveryMutationDoesNotCorruptStore(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	sent := fullMessage()
	sent.Header.DeliveryCount = 0
	mustSend(t, q, sent)
	mutate(sent) // the sender reuses its message
	d := mustReceive(t, q, PeekLock)
	// The broker stores the encoding, so a delivery is the message as the
	// wire gives it (a nested map with string keys comes back as a
	// map[string]any).
	want := roundTrip(t, fullMessage())
	assert.Equal(t, want.Data, d.Message.Data)
	assert.Equal(t, want.ApplicationProperties, d.Message.ApplicationProperties)

	scribble(d.Message)
	require.NoError(t, q.Release(d.LockToken))
	again := mustReceive(t, q, PeekLock)
	assert.Equal(t, want.Data, again.Message.Data)
	assert.Equal(t, want.Properties, again.Message.Properties)
	assert.Equal(t, want.Annotations["a"], again.Message.Annotations["a"])
	assert.NotContains(t, again.Message.Annotations, "new")
}

func TestMessagesWithoutIDGetOne(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{DuplicateDetectionWindow: time.Minute})
	for range 2 {
		_, dup, err := q.Send(&amqp.Message{Data: [][]byte{[]byte("anonymous")}}, 10)
		require.NoError(t, err)
		assert.False(t, dup, "an assigned id never counts as a duplicate")
	}
	first, second := mustReceive(t, q, ReceiveAndDelete), mustReceive(t, q, ReceiveAndDelete)
	id1, ok := first.Message.Properties.MessageID.(string)
	require.True(t, ok, "a string id")
	assert.Len(t, id1, 32)
	assert.NotEqual(t, id1, second.Message.Properties.MessageID)

	// An id the sender chose is kept.
	mustSend(t, q, newMsg("mine", "x"))
	assert.Equal(t, "mine", mustReceive(t, q, ReceiveAndDelete).Message.Properties.MessageID)
}

// TestShareBodiesDeliveries: with ShareBodies, which no longer has an
// effect, a delivery is still entirely the caller's own (decoded from the
// stored encoding, body included): changing one delivery changes neither
// the stored message nor the next delivery.
func TestShareBodiesDeliveries(t *testing.T) {
	b, err := New(Options{ShareBodies: true}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	q, _ := b.Queue("q")
	m := withAppProps(newMsg("id", "body"), map[string]any{"k": "v"})
	m.Header = &amqp.MessageHeader{Priority: 4}
	mustSend(t, q, m)

	first := q.Peek(1, 1)[0].Message
	d := mustReceive(t, q, PeekLock)
	assert.NotSame(t, &first.Data[0][0], &d.Message.Data[0][0], "each delivery decodes its own body")
	d.Message.ApplicationProperties["k"] = "changed"
	d.Message.Annotations[AnnotationSequenceNumber] = int64(99)
	d.Message.Header.Priority = 9
	d.Message.Properties.MessageID = "other"
	d.Message.DeliveryAnnotations = amqp.Annotations{"x": 1}
	d.Message.Data[0] = []byte("replaced")
	require.NoError(t, q.Abandon(d.LockToken, nil))

	again := mustReceive(t, q, PeekLock)
	assert.Equal(t, "body", body(again))
	assert.Equal(t, "v", again.Message.ApplicationProperties["k"])
	assert.Equal(t, int64(1), again.Message.Annotations[AnnotationSequenceNumber])
	assert.Equal(t, uint8(4), again.Message.Header.Priority)
	assert.Equal(t, "id", again.Message.Properties.MessageID)
	assert.Nil(t, again.Message.DeliveryAnnotations)
}

// roundTrip is m encoded and decoded, as the broker stores and hands out a
// message.
func roundTrip(t *testing.T, m *amqp.Message) *amqp.Message {
	t.Helper()
	data, err := m.MarshalBinary()
	require.NoError(t, err)
	back := new(amqp.Message)
	require.NoError(t, back.UnmarshalBinary(data))
	return back
}

// scribble changes every mutable part of a delivered message in place,
// whatever shapes decoding gave its values.
func scribble(m *amqp.Message) {
	m.Header.DeliveryCount = 99
	scribbleValue(m.DeliveryAnnotations)
	scribbleValue(m.Annotations)
	m.Annotations["new"] = 1
	scribbleValue(m.Properties.MessageID)
	scribbleValue(m.Properties.UserID)
	*m.Properties.To = "x"
	*m.Properties.GroupSequence = 99
	scribbleValue(m.ApplicationProperties)
	for _, d := range m.Data {
		scribbleValue(d)
	}
	scribbleValue(m.Value)
	for _, s := range m.Sequence {
		scribbleValue(s)
	}
	scribbleValue(m.Footer)
}

// scribbleValue overwrites every byte slice inside v.
func scribbleValue(v any) {
	switch v := v.(type) {
	case []byte:
		for i := range v {
			v[i] = 99
		}
	case [][]byte:
		for _, e := range v {
			scribbleValue(e)
		}
	case []any:
		for _, e := range v {
			scribbleValue(e)
		}
	case map[string]any:
		for _, e := range v {
			scribbleValue(e)
		}
	case map[any]any:
		for _, e := range v {
			scribbleValue(e)
		}
	case map[amqp.Symbol]any:
		for _, e := range v {
			scribbleValue(e)
		}
	case amqp.Annotations:
		for _, e := range v {
			scribbleValue(e)
		}
	}
}
