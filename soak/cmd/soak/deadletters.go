package main

import (
	"context"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/soak/internal/ledger"
)

// readDeadLetters reads the whole dead-letter queue through the SDK, by peeking (nothing is locked or
// removed), and names each dead letter by its chain's original MessageID and the attempt that died.
func readDeadLetters(ctx context.Context, client *azservicebus.Client, queue string) ([]ledger.DeadLetter, error) {
	recv, err := client.NewReceiverForQueue(queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	if err != nil {
		return nil, err
	}
	defer recv.Close(context.WithoutCancel(ctx))
	var out []ledger.DeadLetter
	for {
		msgs, err := recv.PeekMessages(ctx, 250, nil)
		if err != nil {
			return nil, err
		}
		if len(msgs) == 0 {
			return out, nil
		}
		for _, m := range msgs {
			id, _ := m.ApplicationProperties[envelope.PropOriginalMessageID].(string)
			if id == "" {
				id = m.MessageID
			}
			if strings.HasPrefix(id, "sbretry-probe-") {
				continue
			}
			attempt, ok := m.ApplicationProperties[envelope.PropDeadLetterAttempt].(int64)
			if !ok {
				if attempt, ok = m.ApplicationProperties[envelope.PropAttempt].(int64); !ok {
					attempt = 1
				}
			}
			d := ledger.DeadLetter{ID: id, Attempt: int(attempt), Seq: -1}
			if m.EnqueuedSequenceNumber != nil {
				d.Seq = *m.EnqueuedSequenceNumber // the sequence number it had in the queue
			}
			if m.DeadLetterReason != nil {
				d.Reason = *m.DeadLetterReason
			}
			out = append(out, d)
		}
	}
}
