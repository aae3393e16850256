package inspect

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// DeadLetterFilter selects dead letters; a zero field selects everything.
type DeadLetterFilter struct {
	// SequenceNumbers keeps only these dead-letter sequence numbers.
	SequenceNumbers []int64
	// Reason keeps dead letters whose [DeadLetter.Reason] equals it, ignoring case.
	Reason string
	// Since and Until keep dead letters with Since <= DeadLetteredAt < Until.
	Since, Until time.Time
	// Contains keeps dead letters whose description or last error contains it, ignoring case.
	Contains string
}

// Match reports whether dl passes every set field of f.
func (f DeadLetterFilter) Match(dl DeadLetter) bool {
	switch {
	case len(f.SequenceNumbers) > 0 && !slices.Contains(f.SequenceNumbers, dl.SequenceNumber):
		return false
	case f.Reason != "" && !strings.EqualFold(f.Reason, dl.Reason):
		return false
	case !f.Since.IsZero() && dl.DeadLetteredAt.Before(f.Since):
		return false
	case !f.Until.IsZero() && !dl.DeadLetteredAt.Before(f.Until):
		return false
	case f.Contains != "":
		needle := strings.ToLower(f.Contains)
		return strings.Contains(strings.ToLower(dl.Description), needle) || strings.Contains(strings.ToLower(dl.LastError), needle)
	}
	return true
}

// DeadLetterList is the result of [Inspector.DeadLetters].
type DeadLetterList struct {
	// Items are the matching dead letters in sequence-number order (the order they were dead-lettered).
	Items []DeadLetter
	// Scan says what was read from the entity's dead-letter queue.
	Scan Scan
	// RetryQueueScan says what was read from the retry queue's dead-letter queue, when
	// [Options.RetryQueue] names another queue (nil otherwise): a chain whose last attempt came from the
	// retry queue is dead-lettered there.
	RetryQueueScan *Scan
}

// DeadLetters lists the dead letters that pass f, reading the dead-letter queue up to
// [Options.MaxPeek] messages.
func (in *Inspector) DeadLetters(ctx context.Context, f DeadLetterFilter) (*DeadLetterList, error) {
	out := &DeadLetterList{}
	for i, src := range in.deadSources() {
		entity := in.sourcePath(src)
		sc, err := in.scan(ctx, src, func(m *azservicebus.ReceivedMessage) {
			if dl := decode(m).deadLetter(entity); f.Match(dl) {
				out.Items = append(out.Items, dl)
			}
		})
		if i == 0 {
			out.Scan = sc
		} else {
			out.RetryQueueScan = &sc
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// DeadLetter returns the dead letter with sequence number seq, with its body and properties in
// [DeadLetter.Message]. It costs one peek of one message; a number not in the dead-letter queue
// returns an error wrapping [ErrNotFound].
func (in *Inspector) DeadLetter(ctx context.Context, seq int64) (*DeadLetter, error) {
	var firstErr error
	for _, src := range in.deadSources() {
		m, err := in.peekOne(ctx, src, seq)
		if err != nil {
			if firstErr == nil || !errors.Is(err, ErrNotFound) {
				firstErr = err
			}
			continue
		}
		dl := decode(m).deadLetter(in.sourcePath(src))
		return &dl, nil
	}
	return nil, firstErr
}
