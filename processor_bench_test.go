package retry_test

import (
	"context"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
)

// BenchmarkProcess compares, in one run, the processor's overhead per message with a hand-written
// loop body (call the handler, complete the message) as the baseline. Settler and sender do nothing,
// so only library work is measured:
//
//	go test -run='^$' -bench=BenchmarkProcess -benchmem -count=6 . | tee bench.txt
func BenchmarkProcess(b *testing.B) {
	msg := func() *azservicebus.ReceivedMessage {
		return &azservicebus.ReceivedMessage{
			MessageID: "order-42", Body: make([]byte, 1024),
			ApplicationProperties: map[string]any{"tenant": "acme", "n": int64(1)},
		}
	}
	ctx := context.Background()
	b.Run("case=success/impl=loop", func(b *testing.B) {
		s := &recordingSettler{}
		m := msg()
		b.ReportAllocs()
		for b.Loop() {
			if err := okHandler(ctx, m); err == nil {
				_ = s.CompleteMessage(ctx, m, nil)
			}
		}
	})
	for _, tc := range []struct {
		name    string
		handler retry.Handler
		renew   bool
	}{
		{"case=success/impl=retry", okHandler, true},
		{"case=success/impl=retry-no-renewal", okHandler, false},
		{"case=failure-schedules-copy/impl=retry", func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p, err := retry.NewProcessor(&discardSender{}, tc.handler, &retry.Options{Logger: discardLogger(), DisableLockRenewal: !tc.renew})
			if err != nil {
				b.Fatal(err)
			}
			s := &recordingSettler{}
			m := msg()
			b.ReportAllocs()
			for b.Loop() {
				p.Process(ctx, s, m)
			}
		})
	}
}
