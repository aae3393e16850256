package retrytest_test

import (
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"

	"github.com/sbretry/retry/retrytest"
)

// BenchmarkSendReceiveComplete is the cycle unit tests repeat most: one message sent, received and
// completed.
func BenchmarkSendReceiveComplete(b *testing.B) {
	br := newBroker(b, clock.NewMock(), &retrytest.BrokerOptions{DuplicateDetection: true})
	r := br.Receiver()
	// No MessageID: the broker assigns a fresh one, so duplicate detection never drops a send.
	msg := &azservicebus.Message{Body: []byte(`{"amount":42}`), ApplicationProperties: map[string]any{"k": "v"}}
	ctx := b.Context()
	for b.Loop() {
		if _, err := br.Send(msg); err != nil {
			b.Fatal(err)
		}
		msgs, err := r.ReceiveMessages(ctx, 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.CompleteMessage(ctx, msgs[0], nil); err != nil {
			b.Fatal(err)
		}
	}
}
