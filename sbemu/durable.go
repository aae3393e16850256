package sbemu

import (
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/internal/wire"
)

// Acknowledgements under persistence ([Config.DataDir]). The broker
// applies every change at once and journals it without waiting for the
// disk; a change is durable when the broker's AfterSync calls back. So the
// server applies a send, a settlement or a management request as before,
// in order, on the connection's reader, but sends the answer from that
// callback: the client hears "accepted" only once a SIGKILL can no longer
// undo it, and the reader never waits for the disk, so the transfers and
// dispositions of one connection share the journal's fsyncs (group
// commit) instead of taking one each. Answers that wait for a sync go out
// in the order of their requests, but an answer that needs no wait (its
// change was already durable) can overtake one whose callback is still
// running: clients match answers by delivery id and correlation id, as
// they must with Service Bus too. Without persistence the answer is sent
// at once, as it always was; the administration API waits the same way
// (admin.go).

// durableOutcome is the outcome to report for a change whose journaling
// ended with err: the outcome itself, or amqp:internal-error when the
// change could not be made durable (the SDK then retries).
func durableOutcome(state wire.DeliveryState, err error) wire.DeliveryState {
	if err == nil {
		return state
	}
	return rejectedState(condInternalError, "sbemu: "+err.Error())
}

// durableFailureReply turns a management or CBS reply into status 500
// when the change it reports could not be made durable; it keeps the
// correlation id and the status property names the reply already uses.
func durableFailureReply(resp *amqp.Message, err error) *amqp.Message {
	out := &amqp.Message{Properties: resp.Properties, ApplicationProperties: map[string]any{}}
	for k := range resp.ApplicationProperties {
		switch k {
		case statusCodeKey, managementStatusCodeKey:
			out.ApplicationProperties[k] = int32(statusInternalError)
		case statusDescriptionKey, managementStatusDescriptionKey:
			out.ApplicationProperties[k] = "sbemu: " + err.Error()
		}
	}
	return out
}
