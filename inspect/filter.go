package inspect

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// PropertyFilter keeps messages that carry the application property Name with the value Value, the
// value compared as text: a string as it is, a number in decimal, a bool as true or false, a time in
// RFC 3339 (UTC, as many fractional digits as it has). A binary value matches nothing. The zero
// PropertyFilter keeps everything.
type PropertyFilter struct {
	// Name is the property's name, compared exactly (AMQP property names are case-sensitive).
	Name string
	// Value is the text the property's value must equal, compared exactly.
	Value string
}

// ParsePropertyFilter parses "NAME=VALUE", the form the operator tools take; the first "=" separates
// the two, so a value may hold more. Errors wrap [ErrInvalidOptions].
func ParsePropertyFilter(s string) (PropertyFilter, error) {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return PropertyFilter{}, fmt.Errorf("%w: property filter %q: want NAME=VALUE", ErrInvalidOptions, s)
	}
	return PropertyFilter{Name: name, Value: value}, nil
}

// IsZero reports a filter that keeps everything.
func (f PropertyFilter) IsZero() bool { return f.Name == "" }

// String is "NAME=VALUE", as [ParsePropertyFilter] reads it; empty for the zero filter.
func (f PropertyFilter) String() string {
	if f.IsZero() {
		return ""
	}
	return f.Name + "=" + f.Value
}

// match reports whether m passes f.
func (f PropertyFilter) match(m *azservicebus.ReceivedMessage) bool {
	if f.IsZero() {
		return true
	}
	if m == nil {
		return false
	}
	v, ok := m.ApplicationProperties[f.Name]
	if !ok {
		return false
	}
	text, ok := PropertyText(v)
	return ok && text == f.Value
}

// PropertyText is an application property's value as a [PropertyFilter] compares it, and false for a
// value that has no text form (binary data, a list or a map).
func PropertyText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case bool:
		return strconv.FormatBool(x), true
	case int64:
		return strconv.FormatInt(x, 10), true
	case int32:
		return strconv.FormatInt(int64(x), 10), true
	case int16:
		return strconv.FormatInt(int64(x), 10), true
	case int8:
		return strconv.FormatInt(int64(x), 10), true
	case int:
		return strconv.Itoa(x), true
	case uint64:
		return strconv.FormatUint(x, 10), true
	case uint32:
		return strconv.FormatUint(uint64(x), 10), true
	case uint16:
		return strconv.FormatUint(uint64(x), 10), true
	case uint8:
		return strconv.FormatUint(uint64(x), 10), true
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), true
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), true
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano), true
	}
	return "", false
}

// bodyContains reports whether m's body contains needle: ignoring case when the body is UTF-8 text,
// byte for byte otherwise. An empty needle matches every message.
func bodyContains(m *azservicebus.ReceivedMessage, needle string) bool {
	if needle == "" {
		return true
	}
	if m == nil {
		return false
	}
	if utf8.Valid(m.Body) {
		return containsFold(string(m.Body), needle)
	}
	return bytes.Contains(m.Body, []byte(needle))
}

// containsFold reports whether s contains needle, ignoring case.
func containsFold(s, needle string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(needle))
}

// PendingFilter selects pending retries; a zero field selects everything.
type PendingFilter struct {
	// Contains keeps retries whose last error contains it, ignoring case.
	Contains string
	// Property keeps retries carrying an application property with a value (see [PropertyFilter]).
	Property PropertyFilter
	// Since and Until keep retries due at Since <= DueTime < Until.
	Since, Until time.Time
	// Body keeps retries whose body contains it (ignoring case for a UTF-8 body). Bodies are customer
	// data: a front end offers this only when its operator turned it on.
	Body string
}

// IsZero reports a filter that selects everything.
func (f PendingFilter) IsZero() bool {
	return f.Contains == "" && f.Property.IsZero() && f.Since.IsZero() && f.Until.IsZero() && f.Body == ""
}

// match reports whether the pending retry p, read as m, passes every set field of f.
func (f PendingFilter) match(p Pending, m *azservicebus.ReceivedMessage) bool {
	switch {
	case f.Contains != "" && !containsFold(p.LastError, f.Contains):
		return false
	case !f.Since.IsZero() && p.DueTime.Before(f.Since):
		return false
	case !f.Until.IsZero() && !p.DueTime.Before(f.Until):
		return false
	case !f.Property.match(m):
		return false
	}
	return bodyContains(m, f.Body)
}
