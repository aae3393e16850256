package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// PropResubmittedFrom is set on a message made by [Resubmit]: the MessageID of the first delivery
// of the chain that was dead-lettered (as [PropOriginalMessageID], which it also sets). The default
// idempotency key of a resubmitted message is this id, so handlers see the same key as for the original.
const PropResubmittedFrom = "sbretry-resubmitted-from"

// Resubmit returns a fresh first delivery made from a dead-lettered message at now, for an
// operator who fixed the cause and wants the message processed again. Resubmitting the dead letter as
// it is falls into two traps: its MessageID was already seen (duplicate detection drops the resend
// silently), and its retry properties still say "last attempt" (it dies again after one failure). The
// fresh message:
//
//   - keeps the body, content type, correlation id, subject, To, ReplyTo, session and partition keys and
//     the application properties of the producer;
//   - keeps the chain's identity, so that the handler's [Envelope] names the message as before:
//     OriginalMessageID is the producer's MessageID (also in [PropResubmittedFrom]), and Key and
//     CorrelationID are the dead letter's;
//   - drops every other sbretry-* property and the broker's DeadLetterReason/DeadLetterErrorDescription,
//     so it starts again at attempt 1 with the full retry schedule;
//   - counts the redrive: [PropRedrives] one more than the dead letter's, [PropRedrivenAt] now, which
//     the handler sees as Envelope.Redrives and RedrivenAt;
//   - gets the MessageID "sbretry-resubmit-" + a hash of the dead letter's sequence number and MessageID:
//     the same dead letter always makes the same id, so a resubmission repeated after a crash (resend
//     done, dead letter not yet completed) is absorbed by duplicate detection, while resubmitting it
//     again later, after the window, works;
//   - has no TimeToLive unless ttl > 0 (the original's lifetime has usually passed).
//
// Send it to the entity the dead letter came from; for a subscription, that must be the subscription's
// own path (a forwarding queue or its retry queue), never the topic, or every subscription gets a copy.
// Resubmit returns nil for a nil message.
func Resubmit(dead *azservicebus.ReceivedMessage, ttl time.Duration, now time.Time) *azservicebus.Message {
	if dead == nil {
		return nil
	}
	// The identity as the dead letter's envelope has it; a dead letter whose envelope does not decode
	// keeps what can be read.
	env, err := Decode(dead)
	if err != nil {
		env = Envelope{OriginalMessageID: dead.MessageID}
		readIdentity(dead, &env)
	}
	props := make(map[string]any, len(dead.ApplicationProperties)+5)
	for k, v := range dead.ApplicationProperties {
		if strings.HasPrefix(k, "sbretry-") || k == "DeadLetterReason" || k == "DeadLetterErrorDescription" {
			continue
		}
		props[k] = cloneValue(v)
	}
	props[PropResubmittedFrom] = env.OriginalMessageID
	props[PropOriginalMessageID] = env.OriginalMessageID
	if env.Key != "" {
		props[PropKey] = env.Key
	}
	if env.CorrelationID != "" {
		props[PropCorrelationID] = env.CorrelationID
	}
	props[PropRedrives] = int64(min(env.Redrives, math.MaxInt32-1) + 1)
	props[PropRedrivenAt] = now.UTC()

	seq := int64(-1)
	if dead.SequenceNumber != nil {
		seq = *dead.SequenceNumber
	}
	sum := sha256.Sum256([]byte(strconv.FormatInt(seq, 10) + ":" + dead.MessageID))
	id := "sbretry-resubmit-" + hex.EncodeToString(sum[:20])

	var body []byte
	if dead.Body != nil {
		body = append(make([]byte, 0, len(dead.Body)), dead.Body...)
	}
	m := &azservicebus.Message{
		ApplicationProperties: props,
		Body:                  body,
		ContentType:           cloneString(dead.ContentType),
		CorrelationID:         cloneString(dead.CorrelationID),
		MessageID:             &id,
		PartitionKey:          cloneString(dead.PartitionKey),
		ReplyTo:               cloneString(dead.ReplyTo),
		ReplyToSessionID:      cloneString(dead.ReplyToSessionID),
		SessionID:             cloneString(dead.SessionID),
		Subject:               cloneString(dead.Subject),
		To:                    cloneString(dead.To),
	}
	if ttl > 0 {
		m.TimeToLive = &ttl
	}
	return m
}

// readIdentity reads the identity properties of a message whose envelope as a whole does not decode,
// each on its own: what is valid is kept, what is not is left out.
func readIdentity(msg *azservicebus.ReceivedMessage, env *Envelope) {
	for _, f := range []struct {
		name string
		dst  *string
	}{{PropResubmittedFrom, &env.OriginalMessageID}, {PropOriginalMessageID, &env.OriginalMessageID}, {PropKey, &env.Key}, {PropCorrelationID, &env.CorrelationID}} {
		var err error
		setString(msg.ApplicationProperties, f.name, MaxIdentifierLength, f.dst, &err)
	}
}
