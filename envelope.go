package retry

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/redact"
)

// Service Bus limits on message headers (the quotas page): one property may take 32 KiB, and all
// properties, system and application, 64 KiB together. A retry copy over them is refused by the broker
// on every redelivery, so the processor dead-letters it instead.
const (
	maxPropertySize = 32 * 1024
	maxHeaderSize   = 64 * 1024
)

// oversize says why the retry copy m would not fit the Service Bus limits, with the size and the limit
// ("" when it fits): its estimated encoded size within maxMessageSize, each application property
// within 32 KiB and the headers within 64 KiB. The estimates err on the large side (a fixed allowance
// for framing, the widest encoding for numbers). The text becomes the dead-letter's description, so an
// operator sees what was too large by how much without opening the message.
func oversize(m *azservicebus.Message, maxMessageSize int) string {
	const framing = 512
	header := 0
	for _, s := range []*string{m.ContentType, m.CorrelationID, m.MessageID, m.PartitionKey, m.ReplyTo, m.ReplyToSessionID, m.SessionID, m.Subject, m.To} {
		if s != nil {
			header += len(*s) + 5
		}
	}
	for k, v := range m.ApplicationProperties {
		size := len(k) + 5 + valueSize(v)
		if size > maxPropertySize {
			return fmt.Sprintf("the retry copy's application property %q takes about %d bytes; the limit is %d", redact.String(truncate(k, 64)), size, maxPropertySize)
		}
		header += size
	}
	if header > maxHeaderSize {
		return fmt.Sprintf("the retry copy's header and application properties take about %d bytes; the limit is %d", header, maxHeaderSize)
	}
	if total := framing + header + len(m.Body); total > maxMessageSize {
		return fmt.Sprintf("the retry copy would take about %d bytes (body %d); the limit is %d (Options.MaxMessageSize)", total, len(m.Body), maxMessageSize)
	}
	return ""
}

// propertiesSize estimates the encoded size of application properties, as oversize counts them.
func propertiesSize(props map[string]any) int {
	n := 0
	for k, v := range props {
		n += len(k) + 5 + valueSize(v)
	}
	return n
}

func valueSize(v any) int {
	switch x := v.(type) {
	case string:
		return len(x) + 5
	case []byte:
		return len(x) + 5
	default:
		return 9
	}
}

// truncate cuts s to at most limit bytes without splitting a UTF-8 sequence, marking the cut.
func truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	mark := "…"
	if limit < len(mark) {
		mark = "" // no room for the mark: a plain cut keeps the bound
	}
	cut := max(limit-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// seed fills what a first delivery's envelope lacks: the key, the correlation id (the message's
// CorrelationID, else the key) and the chain's identity (this processor's entity and the delivery's
// sequence number). A copy written by an older version has no chain identity either; its chain is re-based on
// its own delivery, whose sequence number is as stable across redeliveries.
func seed(msg *azservicebus.ReceivedMessage, env envelope.Envelope, entity string, key func(*azservicebus.ReceivedMessage) string) envelope.Envelope {
	if env.Key == "" {
		env.Key = key(msg)
		if len(env.Key) > envelope.MaxIdentifierLength {
			sum := sha256.Sum256([]byte(env.Key))
			env.Key = "sha256-" + hex.EncodeToString(sum[:])
		}
	}
	if env.CorrelationID == "" {
		env.CorrelationID = env.Key
		if msg.CorrelationID != nil && *msg.CorrelationID != "" && len(*msg.CorrelationID) <= envelope.MaxIdentifierLength {
			env.CorrelationID = *msg.CorrelationID
		}
	}
	if env.Source == "" {
		env.Source = entity
	}
	if env.FirstSequenceNumber < 0 && msg.SequenceNumber != nil {
		env.FirstSequenceNumber = *msg.SequenceNumber
	}
	return env
}

// keyOrFallback returns k, or, if it is empty, the sequence number and then the lock token.
func keyOrFallback(k string, msg *azservicebus.ReceivedMessage) string {
	if k != "" {
		return k
	}
	if msg.SequenceNumber != nil {
		return fmt.Sprintf("seq-%d", *msg.SequenceNumber)
	}
	return fmt.Sprintf("lock-%x", msg.LockToken)
}
