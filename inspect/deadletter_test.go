package inspect

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

func TestDeadLetterFilter(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	dl := DeadLetter{Entity: "q/$DeadLetterQueue", SequenceNumber: 7, Reason: "RetryMaxAttemptsExceeded", Description: "HTTP 503 from payments", LastError: "timeout talking to ledger", DeadLetteredAt: at,
		Message: &azservicebus.ReceivedMessage{Body: []byte(`{"customer":"ACME-7"}`), ApplicationProperties: map[string]any{
			"tenant": "acme", "priority": int64(3), "urgent": true, "at": at, "blob": []byte("acme"),
		}}}
	cases := []struct {
		name string
		f    DeadLetterFilter
		want bool
	}{
		{"zero filter", DeadLetterFilter{}, true},
		{"reason ignoring case", DeadLetterFilter{Reason: "retrymaxattemptsexceeded"}, true},
		{"other reason", DeadLetterFilter{Reason: "MaxDeliveryCountExceeded"}, false},
		{"ref listed", DeadLetterFilter{Refs: []Ref{{Entity: "q/$DeadLetterQueue", SequenceNumber: 3}, {Entity: "Q/$deadletterqueue", SequenceNumber: 7}}}, true},
		{"ref not listed", DeadLetterFilter{Refs: []Ref{{Entity: "q/$DeadLetterQueue", SequenceNumber: 3}}}, false},
		{"same number in another entity", DeadLetterFilter{Refs: []Ref{{Entity: "retry/$DeadLetterQueue", SequenceNumber: 7}}}, false},
		{"number without entity", DeadLetterFilter{Refs: []Ref{{SequenceNumber: 7}}}, false},
		{"since inclusive", DeadLetterFilter{Since: at}, true},
		{"since after", DeadLetterFilter{Since: at.Add(time.Second)}, false},
		{"until exclusive", DeadLetterFilter{Until: at}, false},
		{"until after", DeadLetterFilter{Until: at.Add(time.Second)}, true},
		{"contains description", DeadLetterFilter{Contains: "http 503"}, true},
		{"contains last error", DeadLetterFilter{Contains: "LEDGER"}, true},
		{"contains nothing", DeadLetterFilter{Contains: "disk full"}, false},
		{"contains and another reason", DeadLetterFilter{Contains: "ledger", Reason: "Other"}, false},
		{"property string", DeadLetterFilter{Property: PropertyFilter{Name: "tenant", Value: "acme"}}, true},
		{"property value case matters", DeadLetterFilter{Property: PropertyFilter{Name: "tenant", Value: "ACME"}}, false},
		{"property name case matters", DeadLetterFilter{Property: PropertyFilter{Name: "Tenant", Value: "acme"}}, false},
		{"property number", DeadLetterFilter{Property: PropertyFilter{Name: "priority", Value: "3"}}, true},
		{"property bool", DeadLetterFilter{Property: PropertyFilter{Name: "urgent", Value: "true"}}, true},
		{"property time", DeadLetterFilter{Property: PropertyFilter{Name: "at", Value: "2026-05-01T12:00:00Z"}}, true},
		{"property binary matches nothing", DeadLetterFilter{Property: PropertyFilter{Name: "blob", Value: "acme"}}, false},
		{"property absent", DeadLetterFilter{Property: PropertyFilter{Name: "region", Value: ""}}, false},
		{"body ignoring case", DeadLetterFilter{Body: "acme-7"}, true},
		{"body without it", DeadLetterFilter{Body: "globex"}, false},
		{"contains and property", DeadLetterFilter{Contains: "ledger", Property: PropertyFilter{Name: "tenant", Value: "acme"}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, tc.f.Match(dl)) })
	}
}

func TestParsePropertyFilter(t *testing.T) {
	f, err := ParsePropertyFilter("tenant=a=b")
	require.NoError(t, err)
	assert.Equal(t, PropertyFilter{Name: "tenant", Value: "a=b"}, f)
	assert.Equal(t, "tenant=a=b", f.String())
	f, err = ParsePropertyFilter("tenant=")
	require.NoError(t, err)
	assert.Equal(t, PropertyFilter{Name: "tenant"}, f, "an empty value is a value")
	for _, bad := range []string{"", "tenant", "=acme"} {
		_, err := ParsePropertyFilter(bad)
		assert.ErrorIs(t, err, ErrInvalidOptions, bad)
	}
}

// TestDeadLettersFromRetryAndBroker lists a dead letter the processor wrote (with the sbretry-*
// dead-letter properties) next to one dead-lettered by hand through the SDK (broker properties only),
// and shows one by its sequence number.
func TestDeadLettersFromRetryAndBroker(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.Send(t, sbtest.Message("poison-1"))
	c := h.StartConsumer(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		return retry.RetryAfter(time.Millisecond, errBoom)
	}, retry.Options{MaxAttempts: 3, Backoff: backoff.Constant{Interval: 10 * time.Millisecond}})
	c.Out.WaitFor(t, "dead letter", func(ps []retry.ProcessedParams) bool {
		_, ok := sbtest.Result(ps, "poison-1", retry.OutcomeDeadLettered)
		return ok
	})
	c.Stop()

	ctx := sbtest.Context(t)
	h.Send(t, sbtest.Message("manual-1"))
	r, err := h.Client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	got, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.NoError(t, r.DeadLetterMessage(ctx, got[0], &azservicebus.DeadLetterOptions{Reason: ptr("OperatorParked"), ErrorDescription: ptr("parked by hand")}))

	in := h.inspector(t, nil)
	list, err := in.DeadLetters(ctx, DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, list.Items, 2)
	assert.Equal(t, Scan{Entity: sbtest.Queue + "/$DeadLetterQueue", Peeked: 2, Requests: 2}, list.Scan)
	ours, manual := list.Items[0], list.Items[1]
	assert.Equal(t, "RetryMaxAttemptsExceeded", ours.Reason)
	assert.Equal(t, 3, ours.Attempt, "from sbretry-dead-letter-attempt")
	assert.Equal(t, "poison-1", ours.Envelope.OriginalMessageID)
	assert.Equal(t, ours.Envelope.RetryMessageID(3), ours.MessageID)
	assert.Equal(t, errBoom.Error(), ours.LastError)
	assert.Equal(t, "OperatorParked", manual.Reason)
	assert.Equal(t, "parked by hand", manual.Description)
	assert.Equal(t, 1, manual.Attempt, "a first delivery, by its envelope")
	assert.Empty(t, manual.LastError)
	assert.False(t, manual.DeadLetteredAt.IsZero(), "the dead-letter queue's enqueue time")

	only, err := in.DeadLetters(ctx, DeadLetterFilter{Reason: "operatorparked"})
	require.NoError(t, err)
	require.Len(t, only.Items, 1)
	assert.Equal(t, "manual-1", only.Items[0].MessageID)

	one, err := in.DeadLetter(ctx, manual.Ref())
	require.NoError(t, err)
	assert.Equal(t, "manual-1", one.MessageID)
	assert.JSONEq(t, `{"id":"manual-1"}`, string(one.Message.Body))
	_, err = in.DeadLetter(ctx, Ref{SequenceNumber: manual.SequenceNumber + 100})
	assert.ErrorIs(t, err, ErrNotFound)
}

func TestDeadLetteredBy(t *testing.T) {
	ours := &azservicebus.ReceivedMessage{ApplicationProperties: map[string]any{envelope.PropDeadLetterReason: "RetryMaxAttemptsExceeded"}}
	plain := &azservicebus.ReceivedMessage{}
	for _, tc := range []struct {
		name string
		dl   DeadLetter
		want string
	}{
		{"the retry library's", DeadLetter{Reason: "MaxDeliveryCountExceeded", Message: ours}, ByRetry},
		{"max deliveries", DeadLetter{Reason: "MaxDeliveryCountExceeded", Message: plain}, ByServiceBus},
		{"expired", DeadLetter{Reason: "TTLExpiredException", Message: plain}, ByServiceBus},
		{"session id, any case and a full stop", DeadLetter{Reason: "Session ID is null.", Message: plain}, ByServiceBus},
		{"an application's", DeadLetter{Reason: "OperatorParked", Message: plain}, ByApplication},
		{"no message", DeadLetter{Reason: "Poison"}, ByApplication},
	} {
		assert.Equal(t, tc.want, tc.dl.DeadLetteredBy(), tc.name)
	}
}
