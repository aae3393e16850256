package retrytest_test

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/retrytest"
)

// A receiver sees every field the SDK carries, translated as the SDK translates it.
func TestReceivedMessageCarriesTheSDKFields(t *testing.T) {
	mock := clock.NewMock()
	b := newBroker(t, mock, nil)
	ttl := time.Hour
	sent := &azservicebus.Message{
		MessageID: str("id"), Body: []byte("body"), ContentType: str("application/json"), CorrelationID: str("corr"),
		Subject: str("subj"), To: str("to"), ReplyTo: str("reply"), ReplyToSessionID: str("rs"), SessionID: str("sess"),
		PartitionKey: str("pk"), TimeToLive: &ttl, ApplicationProperties: map[string]any{"n": int64(7), "s": "v"},
	}
	_, err := b.Send(sent)
	require.NoError(t, err)
	_, err = b.Send(&azservicebus.Message{Body: []byte("plain")})
	require.NoError(t, err)

	msgs, err := b.Receiver().ReceiveMessages(t.Context(), 2, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	m := msgs[0]
	assert.Equal(t, "id", m.MessageID)
	assert.Equal(t, []byte("body"), m.Body)
	assert.Equal(t, sent.ContentType, m.ContentType)
	assert.Equal(t, sent.CorrelationID, m.CorrelationID)
	assert.Equal(t, sent.Subject, m.Subject)
	assert.Equal(t, sent.To, m.To)
	assert.Equal(t, sent.ReplyTo, m.ReplyTo)
	assert.Equal(t, sent.ReplyToSessionID, m.ReplyToSessionID)
	assert.Equal(t, sent.SessionID, m.SessionID)
	assert.Equal(t, sent.PartitionKey, m.PartitionKey)
	assert.Equal(t, sent.ApplicationProperties, m.ApplicationProperties)
	assert.Equal(t, uint32(1), m.DeliveryCount)
	assert.EqualValues(t, 1, *m.SequenceNumber)
	assert.Equal(t, mock.Now(), *m.EnqueuedTime)
	assert.Equal(t, mock.Now().Add(ttl), *m.ExpiresAt)
	assert.Equal(t, ttl, *m.TimeToLive)
	assert.Equal(t, azservicebus.MessageStateActive, m.State)
	assert.Nil(t, m.ScheduledEnqueueTime)
	assert.NotEqual(t, [16]byte{}, m.LockToken)
	require.NotNil(t, m.RawAMQPMessage)
	assert.Equal(t, [][]byte{[]byte("body")}, m.RawAMQPMessage.Body.Data)

	// Like the SDK: a message without a TimeToLive reports a zero one, not nil.
	require.NotNil(t, msgs[1].TimeToLive)
	assert.Zero(t, *msgs[1].TimeToLive)
	assert.NotEqual(t, msgs[0].LockToken, msgs[1].LockToken)
}

// Bad input is an error, never a panic, and stores nothing.
func TestBadInputIsAnError(t *testing.T) {
	b := newBroker(t, clock.NewMock(), nil)
	ctx := t.Context()
	_, err := b.Send(nil)
	assert.Error(t, err)

	_, err = b.Sender().ScheduleMessages(ctx, []*azservicebus.Message{{MessageID: str("ok")}, nil}, time.Time{}, nil)
	assert.Error(t, err)
	_, err = b.Send(&azservicebus.Message{ApplicationProperties: map[string]any{"bad": struct{}{}}})
	assert.Error(t, err, "AMQP cannot encode a struct; the SDK refuses it too")
	_, err = b.Send(&azservicebus.Message{ApplicationProperties: map[string]any{"big": string(make([]byte, 33*1024))}})
	assert.Error(t, err, "a property over 32 KiB")
	assert.Equal(t, retrytest.Stats{}, b.Stats(), "nothing stored")
	assert.Empty(t, b.Scheduled())

	r := b.Receiver()
	assert.Error(t, r.CompleteMessage(ctx, nil, nil))
	assert.Error(t, r.DeadLetterMessage(ctx, nil, nil))
	assert.Error(t, r.RenewMessageLock(ctx, nil, nil))
	_, err = r.ReceiveMessages(ctx, 0, nil)
	assert.Error(t, err)

	// A nil body is what the SDK sends as an empty data section: accepted.
	_, err = b.Send(&azservicebus.Message{})
	require.NoError(t, err)
	msgs, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	assert.Empty(t, msgs[0].Body)

	// A message received elsewhere has a lock this broker does not know.
	assert.ErrorAs(t, r.CompleteMessage(ctx, &azservicebus.ReceivedMessage{}, nil), new(*azservicebus.Error))
}
