package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
)

// formatTime renders t for people and for sorting: RFC 3339 in UTC sorts as text, and milliseconds are
// what Service Bus stores. Unknown times say so rather than printing year 1.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// clip shortens s to n runes for a table cell, on one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// writeJSON writes v indented, for jq.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Output shapes of --json. Text fields that come from messages are redacted like everything else. The
// names are camelCase like the Azure CLI's, and stable: scripts depend on them.

type jsonScan struct {
	Entity    string `json:"entity"`
	Peeked    int    `json:"peeked"`
	Requests  int    `json:"requests"`
	Truncated bool   `json:"truncated"`
}

func scansJSON(scans []inspect.Scan) []jsonScan {
	out := make([]jsonScan, len(scans))
	for i, s := range scans {
		out[i] = jsonScan{Entity: s.Entity, Peeked: s.Peeked, Requests: s.Requests, Truncated: s.Truncated}
	}
	return out
}

type jsonPending struct {
	Ref               string    `json:"ref"`
	Entity            string    `json:"entity"`
	SequenceNumber    int64     `json:"sequenceNumber"`
	MessageID         string    `json:"messageId"`
	DueTime           time.Time `json:"dueTime"`
	Attempt           int       `json:"attempt"`
	LastError         string    `json:"lastError,omitempty"`
	Key               string    `json:"key,omitempty"`
	CorrelationID     string    `json:"correlationId,omitempty"`
	OriginalMessageID string    `json:"originalMessageId,omitempty"`
}

func pendingJSON(p inspect.Pending) jsonPending {
	return jsonPending{
		Ref: p.Ref().String(), Entity: p.Entity, SequenceNumber: p.SequenceNumber, MessageID: p.MessageID, DueTime: p.DueTime.UTC(),
		Attempt: p.Attempt, LastError: redact.String(p.LastError), Key: p.Envelope.Key,
		CorrelationID: p.Envelope.CorrelationID, OriginalMessageID: p.Envelope.OriginalMessageID,
	}
}

type jsonActive struct {
	Ref            string    `json:"ref"`
	Entity         string    `json:"entity"`
	SequenceNumber int64     `json:"sequenceNumber"`
	MessageID      string    `json:"messageId"`
	Attempt        int       `json:"attempt"`
	EnqueuedTime   time.Time `json:"enqueuedTime"`
	DeliveryCount  uint32    `json:"deliveryCount"`
	LastError      string    `json:"lastError,omitempty"`
}

func activeJSON(a inspect.Active) jsonActive {
	return jsonActive{
		Ref: a.Ref().String(), Entity: a.Entity, SequenceNumber: a.SequenceNumber, MessageID: a.MessageID, Attempt: a.Attempt,
		EnqueuedTime: a.EnqueuedTime.UTC(), DeliveryCount: a.DeliveryCount, LastError: redact.String(a.LastError),
	}
}

type jsonDeadLetter struct {
	Ref               string    `json:"ref"`
	Entity            string    `json:"entity"`
	SequenceNumber    int64     `json:"sequenceNumber"`
	MessageID         string    `json:"messageId"`
	Reason            string    `json:"reason"`
	Description       string    `json:"description,omitempty"`
	Attempt           int       `json:"attempt,omitempty"`
	DeadLetteredAt    time.Time `json:"deadLetteredAt"`
	LastError         string    `json:"lastError,omitempty"`
	Source            string    `json:"source,omitempty"`
	Key               string    `json:"key,omitempty"`
	CorrelationID     string    `json:"correlationId,omitempty"`
	OriginalMessageID string    `json:"originalMessageId,omitempty"`
	EnvelopeError     string    `json:"envelopeError,omitempty"`
	// Show only.
	Properties map[string]any `json:"properties,omitempty"`
	Body       *string        `json:"body,omitempty"`
}

func deadLetterJSON(d inspect.DeadLetter) jsonDeadLetter {
	j := jsonDeadLetter{
		Ref: d.Ref().String(), Entity: d.Entity, SequenceNumber: d.SequenceNumber, MessageID: d.MessageID, Reason: d.Reason,
		Description: redact.String(d.Description), Attempt: d.Attempt, DeadLetteredAt: d.DeadLetteredAt.UTC(),
		LastError: redact.String(d.LastError), Source: d.Source,
		Key: d.Key, CorrelationID: d.CorrelationID, OriginalMessageID: d.OriginalMessageID(),
	}
	if d.EnvelopeErr != nil {
		j.EnvelopeError = redact.String(d.EnvelopeErr.Error())
	}
	return j
}

// displayValue renders an application property value; strings are redacted.
func displayValue(v any) any {
	switch x := v.(type) {
	case string:
		return redact.String(x)
	case time.Time:
		return x.UTC()
	case []byte:
		return fmt.Sprintf("<%d bytes>", len(x))
	}
	return v
}

// displayBody renders a body as text when it is UTF-8 (redacted, at most maxBody bytes), else as its size.
func displayBody(b []byte) string {
	const maxBody = 64 * 1024
	if !utf8.Valid(b) {
		return fmt.Sprintf("<%d bytes of binary data>", len(b))
	}
	s := string(b)
	if len(s) > maxBody {
		s = s[:maxBody] + fmt.Sprintf("… (%d bytes in all)", len(b))
	}
	return redact.String(s)
}
