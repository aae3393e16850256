package dlqaction

import (
	"context"
	"errors"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/inspect"
)

// observedReceiver reports every call a drain makes on a dead-letter queue to the Observer of the
// inspector the plan was selected with ([inspect.Inspector.Observer]), as calls on entity.
type observedReceiver struct {
	Receiver
	obs    inspect.Observer
	entity string
}

// observeReceiver wraps r when obs is set; without one, r is used as it is.
func observeReceiver(r Receiver, obs inspect.Observer, entity string) Receiver {
	if obs == nil {
		return r
	}
	return &observedReceiver{Receiver: r, obs: obs, entity: entity}
}

// ReceiveMessages receives through the wrapped receiver. A receive whose context ran out before a
// message came is how a drain learns the queue has no more for it: it is reported as a receive of no
// message, not as a failure, and its error still returned to the drain.
func (r *observedReceiver) ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	cctx, done := r.obs.StartCall(ctx, inspect.Call{Operation: inspect.OpReceive, Entity: r.entity})
	if cctx == nil {
		cctx = ctx
	}
	msgs, err := r.Receiver.ReceiveMessages(cctx, maxMessages, options)
	if done != nil {
		reported := err
		if errors.Is(err, context.DeadlineExceeded) {
			reported = nil
		}
		done(inspect.CallResult{Messages: len(msgs), Err: reported})
	}
	return msgs, err
}

// CompleteMessage completes message through the wrapped receiver.
func (r *observedReceiver) CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error {
	return inspect.Observe(ctx, r.obs, inspect.Call{Operation: inspect.OpComplete, Entity: r.entity, MessageID: message.MessageID}, func(ctx context.Context) (int, error) {
		return 0, r.Receiver.CompleteMessage(ctx, message, options)
	})
}

// AbandonMessage abandons message through the wrapped receiver.
func (r *observedReceiver) AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error {
	return inspect.Observe(ctx, r.obs, inspect.Call{Operation: inspect.OpAbandon, Entity: r.entity, MessageID: message.MessageID}, func(ctx context.Context) (int, error) {
		return 0, r.Receiver.AbandonMessage(ctx, message, options)
	})
}
