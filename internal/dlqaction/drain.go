package dlqaction

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/inspect"
)

// Receiver lists the methods of *azservicebus.Receiver that a redrive or purge calls on the
// dead-letter queue, received in peek-lock mode.
type Receiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
}

var _ Receiver = (*azservicebus.Receiver)(nil)

// receiveBatch is the most dead letters one receive asks for. Their locks run while the batch is
// worked through one send at a time, so it stays small.
const receiveBatch = 50

// receiveCount is how many messages the next receive of a drain asks for: no more than the selected
// dead letters still to come (nor the batch, nor the holds left). A receive grants the link that
// much credit, and credit the receive does not use stays on the link after it returns: the broker
// sends more messages on it, among them the ones the drain gives back at its end, which go back to
// the queue and out again at once. The SDK releases what arrives between receives
// (Receiver.ReceiveMessages starts newReleaserFunc, azservicebus v1.11.0 receiver.go), but
// Receiver.Close stops that releaser first, and a message on its way then reaches a link that is
// closing. Service Bus keeps the lock of a message delivered to a receive link until it is settled or
// expires, also when the link closes: the SDK settles such a message by its lock token over the
// management link (messageSettler.go, shouldSettleOnMgmtLink; the same for one built with a lock token
// only), a client closing its link sees its messages stay locked (Azure/amqpnetlite#340), and sbemu
// keeps them so (session.go, forgetDeliveriesLocked). The next redrive or purge then found it locked.
//
// Asking for no more than is still wanted leaves no credit once the last selected dead letter is in:
// the receive that brings it asked for at most the rest of the selection, all of which it returned.
// Far from the last selected dead letter (its sequence number more than a batch beyond the highest
// received: a queue delivers in sequence order, so more than a batch of numbers lie between) a receive
// asks for a whole batch, since the messages before it have to be received anyway; that keeps a
// selection behind many others from costing a round trip per message. Where most of those numbers
// are gaps (dead letters removed earlier), such a batch can bring the last selected one and come back
// short, its credit left on the link; drain then gives what it held back only after the close
// ([giveBack]), and only a message the broker sends in that instant to the closing link stays locked.
func receiveCount(remaining, held, holdLimit int, last, highest int64) int {
	n := remaining
	if highest >= 0 && last-highest > receiveBatch {
		n = receiveBatch
	}
	return min(receiveBatch, n, holdLimit-held)
}

// settleTimeout bounds the abandons at the end of a drain and the closing of links, which run even
// when the caller's context is done, so that the messages it held are released at once instead of when their locks expire.
const settleTimeout = 10 * time.Second

// drain receives the dead-letter queue in peek-lock mode until every sequence number in want was
// received and passed to each, which must settle it (complete it, after whatever it does first).
// Every other message received on the way is held, locked and untouched, so that the receive moves
// on instead of getting it again, and given back at the end (abandoned: its delivery count goes up by
// one, which no dead-letter queue acts on). At most holdLimit messages are held.
//
// A held message is abandoned through r only while r's link has no credit left (its last receive
// returned as many messages as it asked for): one abandoned while credit is left goes straight back
// to r, and is lost in its close (see receiveCount). Otherwise (a receive that waited in vain, an
// error, a cancellation) drain abandons nothing and returns the held messages in left: the caller
// closes r first and then gives them back by lock token ([giveBack]).
//
// drain stops at the first error of each, leaving the rest for a re-run; and when a receive waits
// wait without a message, it returns with the sequence numbers not received in missing (they were
// removed meanwhile, or are locked by another receiver).
func drain(ctx context.Context, r Receiver, want []int64, wait time.Duration, holdLimit int, peekLimitName string,
	each func(ctx context.Context, m *azservicebus.ReceivedMessage) error, progress func(done int)) (done int, missing []int64, left []*azservicebus.ReceivedMessage, err error) {
	remaining := make(map[int64]bool, len(want))
	for _, s := range want {
		remaining[s] = true
	}
	held := make(map[int64]*azservicebus.ReceivedMessage)
	creditLeft := false  // the link may still have credit: the last receive returned fewer than it asked for
	highest := int64(-1) // the highest sequence number received
	defer func() {
		if creditLeft {
			for _, k := range slices.Sorted(maps.Keys(held)) {
				left = append(left, held[k])
			}
			return
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		for _, m := range held {
			_ = r.AbandonMessage(actx, m, nil) // a lost lock releases it just the same
		}
	}()
	for len(remaining) > 0 {
		if len(held) >= holdLimit {
			return done, nil, nil, fmt.Errorf("received %d other dead letters before the selected ones; raise %s or narrow the selection", len(held), peekLimitName)
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		ask := receiveCount(len(remaining), len(held), holdLimit, slices.Max(slices.Collect(maps.Keys(remaining))), highest)
		msgs, err := r.ReceiveMessages(rctx, ask, nil)
		cancel()
		creditLeft = len(msgs) < ask
		switch {
		case ctx.Err() != nil:
			creditLeft = true
			return done, nil, nil, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			return done, sortedKeys(remaining), nil, nil // nothing more arrives
		case err != nil:
			return done, nil, nil, fmt.Errorf("receiving from the dead-letter queue: %w", err)
		}
		// (nil, nil) means the SDK recovered a link; the next call receives again.
		for i, m := range msgs {
			seq := int64(-1)
			if m.SequenceNumber != nil {
				seq = *m.SequenceNumber
			}
			highest = max(highest, seq)
			if !remaining[seq] {
				held[seq] = m // a redelivery after a lock expiry replaces the earlier copy
				continue
			}
			if err := each(ctx, m); err != nil {
				for j, rest := range msgs[i:] {
					held[-1-int64(j)] = rest // keys only need to be distinct: these are given back
				}
				return done, nil, nil, fmt.Errorf("dead letter %d: %w", seq, err)
			}
			delete(remaining, seq)
			done++
			progress(done)
		}
	}
	return done, nil, nil, nil
}

// giveBack abandons the messages a drain left locked on a receiver that is now closed, by their lock
// tokens, through the management link of a fresh receiver on the same dead-letter queue: one that
// never receives, so no credit on any link takes them again ([drain]). A message built with a lock
// token only is settled that way by the SDK (messageSettler.go, shouldSettleOnMgmtLink), as Service
// Bus settles a message whose receive link is gone. It runs, bounded, even when ctx is done, and
// returns an error naming how many were not given back (their locks expire on their own).
func giveBack(ctx context.Context, client *azservicebus.Client, obs inspect.Observer, entity string, left []*azservicebus.ReceivedMessage) error {
	if len(left) == 0 {
		return nil
	}
	raw, err := OpenDeadLetterReceiver(client, entity)
	if err != nil {
		return fmt.Errorf("%d dead letters received on the way stay locked in %s until their locks expire: %w", len(left), entity, err)
	}
	defer closeLink(ctx, raw)
	r := observeReceiver(raw, obs, entity)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	failed := 0
	var first error
	for _, m := range left {
		byToken := &azservicebus.ReceivedMessage{LockToken: m.LockToken, MessageID: m.MessageID, SequenceNumber: m.SequenceNumber}
		var sbErr *azservicebus.Error
		if err := r.AbandonMessage(actx, byToken, nil); err != nil && !(errors.As(err, &sbErr) && sbErr.Code == azservicebus.CodeLockLost) {
			// A lock that was lost released the message just the same.
			failed++
			first = cmp.Or(first, err)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of the %d dead letters received on the way could not be given back and stay locked in %s until their locks expire: %w", failed, len(left), entity, first)
	}
	return nil
}

func sortedKeys(m map[int64]bool) []int64 { return slices.Sorted(maps.Keys(m)) }
