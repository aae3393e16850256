package console

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
	"github.com/sbretry/retry/internal/redact"
)

// failureGroup is the dead letters of one entity that share a reason and a fingerprint of their last error.
type failureGroup struct {
	// ID is the [Fingerprint] of Reason and the error.
	ID string
	// Reason is the dead-letter reason.
	Reason string
	// Pattern is the normalized, redacted error ([NormalizeError]).
	Pattern string
	// Count is the number of dead letters in the group, among the messages read.
	Count int
	// FirstSeen and LastSeen bound their dead-letter times.
	FirstSeen, LastSeen time.Time
	// Example is the group's most recent dead letter.
	Example inspect.DeadLetter
	// Items are the group's dead letters in the order they were read.
	Items []inspect.DeadLetter
}

// errorText is what a dead letter's fingerprint is computed from: the retry library's last error, else
// the broker's description; redacted first, so that a secret never reaches a pattern.
func errorText(d inspect.DeadLetter) string {
	if d.LastError != "" {
		return redact.String(d.LastError)
	}
	return redact.String(d.Description)
}

// byText names who dead-lettered a message ([inspect.DeadLetter.DeadLetteredBy]) for the pages.
func byText(by string) string {
	switch by {
	case inspect.ByRetry:
		return "the retry library"
	case inspect.ByServiceBus:
		return "Service Bus"
	}
	return "an application"
}

// groupDeadLetters groups items by fingerprint, the largest group first (then the most recent), so the
// failure that matters most is at the top. Each group keeps its items in read order, which is the
// order a redrive receives them in.
func groupDeadLetters(items []inspect.DeadLetter) []*failureGroup {
	byID := map[string]*failureGroup{}
	var out []*failureGroup
	for _, d := range items {
		text := errorText(d)
		id := Fingerprint(d.Reason, text)
		g := byID[id]
		if g == nil {
			g = &failureGroup{ID: id, Reason: d.Reason, Pattern: NormalizeError(text), FirstSeen: d.DeadLetteredAt, LastSeen: d.DeadLetteredAt, Example: d}
			byID[id] = g
			out = append(out, g)
		}
		g.Count++
		g.Items = append(g.Items, d)
		if d.DeadLetteredAt.Before(g.FirstSeen) {
			g.FirstSeen = d.DeadLetteredAt
		}
		if !d.DeadLetteredAt.Before(g.LastSeen) {
			g.LastSeen, g.Example = d.DeadLetteredAt, d
		}
	}
	slices.SortStableFunc(out, func(a, b *failureGroup) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return b.LastSeen.Compare(a.LastSeen)
	})
	return out
}

// groups reads the entity's dead letters and groups them; the selection's scans say whether the read
// was truncated.
func (e *entity) groups(ctx context.Context) ([]*failureGroup, *dlqaction.Selection, error) {
	sel, err := dlqaction.Select(ctx, e.inspector(), inspect.DeadLetterFilter{})
	if err != nil {
		return nil, nil, err
	}
	return groupDeadLetters(sel.Items), sel, nil
}
