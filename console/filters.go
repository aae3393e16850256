package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
)

// Filters of the dead-letter and pending pages, and the "act on all matching" actions they lead to. A
// filter narrows what a page lists; an action on all matching previews exactly the messages the filter
// matches at that moment (entity and sequence number, with their MessageIDs, under the preview's
// digest), and its run acts on exactly those, as a selection of ticked rows would: a message that
// matches only after the preview is not touched, and one of the preview's that is gone or changed
// stops the run before anything is done.

// filterForm is a filter as a page's query or an action's form carries it: every field text, as the
// operator typed it. The same names serve the page (GET) and the preview (POST), so a page's filter
// form and its "act on all matching" buttons carry one filter.
type filterForm struct {
	// Reason is the dead-letter reason (equal, ignoring case; dead letters only).
	Reason string
	// Error is text the last error (or the broker's description) contains, ignoring case.
	Error string
	// Property is NAME=VALUE, an application property and its value as text.
	Property string
	// Since and Until bound the dead-letter time, or a pending retry's due time: RFC 3339, or the
	// 2006-01-02T15:04 of a datetime-local input, read as UTC (the pages show UTC).
	Since, Until string
	// Body is text the body contains, ignoring case: only with Options.FilterBodies.
	Body string
}

// The query and form names of the filter's fields.
const (
	filterReason   = "reason"
	filterError    = "error"
	filterProperty = "prop"
	filterSince    = "since"
	filterUntil    = "until"
	filterBody     = "body"
)

// maxFilterField bounds each field of a filter, like the search query.
const maxFilterField = maxQueryBytes

// readFilter reads the filter of r's query or form. A field over maxFilterField bytes or not UTF-8 is
// refused, and so is a body filter unless bodies may be searched (Options.FilterBodies).
func readFilter(r *http.Request, bodies bool) (filterForm, error) {
	f := filterForm{
		Reason: r.FormValue(filterReason), Error: r.FormValue(filterError), Property: r.FormValue(filterProperty),
		Since: r.FormValue(filterSince), Until: r.FormValue(filterUntil), Body: r.FormValue(filterBody),
	}
	for name, v := range map[string]string{filterReason: f.Reason, filterError: f.Error, filterProperty: f.Property, filterSince: f.Since, filterUntil: f.Until, filterBody: f.Body} {
		switch {
		case len(v) > maxFilterField:
			return f, fmt.Errorf("the filter %s is %d bytes long; at most %d", name, len(v), maxFilterField)
		case !utf8.ValidString(v):
			return f, fmt.Errorf("the filter %s is not UTF-8 text", name)
		}
	}
	if f.Body != "" && !bodies {
		return f, fmt.Errorf("filtering by body text is off: bodies are customer data, and this console was not given Options.FilterBodies (sbretry serve --filter-bodies)")
	}
	if _, err := f.deadLetters(); err != nil {
		return f, err
	}
	return f, nil
}

// active reports whether the filter narrows anything.
func (f filterForm) active() bool {
	return f.Reason != "" || f.Error != "" || f.Property != "" || f.Since != "" || f.Until != "" || f.Body != ""
}

// parseFilterTime reads a time of the filter: RFC 3339, or a datetime-local input's value in UTC.
func parseFilterTime(name, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil // no zone: UTC, as every page shows times
		}
	}
	return time.Time{}, fmt.Errorf("the filter %s %q is not a time: give 2026-01-02T15:04 (UTC) or RFC 3339", name, showable(s))
}

// deadLetters is the filter as package inspect applies it to dead letters.
func (f filterForm) deadLetters() (inspect.DeadLetterFilter, error) {
	out := inspect.DeadLetterFilter{Reason: f.Reason, Contains: f.Error, Body: f.Body}
	var err error
	if f.Property != "" {
		if out.Property, err = inspect.ParsePropertyFilter(f.Property); err != nil {
			return out, fmt.Errorf("the filter %s %q is not NAME=VALUE", filterProperty, showable(f.Property))
		}
	}
	if out.Since, err = parseFilterTime(filterSince, f.Since); err != nil {
		return out, err
	}
	if out.Until, err = parseFilterTime(filterUntil, f.Until); err != nil {
		return out, err
	}
	return out, nil
}

// pending is the filter as package inspect applies it to pending retries: the reason does not apply
// (a pending retry has none), the times bound the due time.
func (f filterForm) pending() (inspect.PendingFilter, error) {
	dl, err := f.deadLetters()
	if err != nil {
		return inspect.PendingFilter{}, err
	}
	return inspect.PendingFilter{Contains: dl.Contains, Property: dl.Property, Since: dl.Since, Until: dl.Until, Body: dl.Body}, nil
}

// query is the filter's part of a page's address, "&reason=…&error=…" (escaped for a URL), for the
// links that keep it: the next page, the other view.
func (f filterForm) query() string {
	v := url.Values{}
	for _, fd := range f.hiddenFields() {
		v.Set(fd.Name, fd.Value)
	}
	if len(v) == 0 {
		return ""
	}
	return "&" + v.Encode()
}

// fields are the filter's fields by their form names.
func (f filterForm) fields() map[string]string {
	return map[string]string{filterReason: f.Reason, filterError: f.Error, filterProperty: f.Property, filterSince: f.Since, filterUntil: f.Until, filterBody: f.Body}
}

// Describe says what the filter selects, for the pages, the preview, its digest and the audit record:
// each set field, redacted, and of a body filter only that there is one and its length (the text an
// operator looks for in bodies may itself be customer data, and the audit log is kept and shipped).
func (f filterForm) Describe() string {
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, name+" "+redact.String(v))
		}
	}
	add("reason is", f.Reason)
	add("error contains", f.Error)
	add("property", f.Property)
	add("from", f.Since)
	add("before", f.Until)
	if f.Body != "" {
		parts = append(parts, fmt.Sprintf("body contains a text of %d characters", utf8.RuneCountInString(f.Body)))
	}
	return strings.Join(parts, "; ")
}

// formField is one hidden field of a form.
type formField struct{ Name, Value string }

// hiddenFields are the filter's set fields, for the hidden inputs of an "act on all matching" form.
func (f filterForm) hiddenFields() []formField {
	var out []formField
	for _, name := range []string{filterReason, filterError, filterProperty, filterSince, filterUntil, filterBody} {
		if v := f.fields()[name]; v != "" {
			out = append(out, formField{Name: name, Value: v})
		}
	}
	return out
}
