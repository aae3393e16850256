package broker

import (
	"fmt"
	"strings"
	"time"

	"github.com/Azure/go-amqp"
)

// DefaultRuleName is the name of the rule every subscription starts with
// when it is configured without rules: a TrueFilter that lets every message
// of the topic in, as on Service Bus.
const DefaultRuleName = "$Default"

// PropertyRuleName is the application property a rule with an action stamps
// on the copy it produces, naming the rule.
const PropertyRuleName = "RuleName"

// RuleConfig is one subscription rule: a filter and, optionally, an action.
// Set at most one of SQLFilter and CorrelationFilter; neither means the
// TrueFilter.
//
// As on Service Bus
// (https://learn.microsoft.com/azure/service-bus-messaging/topic-filters),
// the rules without an action are OR-ed together and give the subscription
// at most one copy of a message however many of them match, while every
// matching rule with an action gives a copy of its own, with the action
// applied and the rule's name in the RuleName application property.
type RuleConfig struct {
	// Name identifies the rule in errors and in RuleName. Empty means
	// [DefaultRuleName].
	Name string

	// SQLFilter is a SQL filter expression (see sqlfilter.go for the
	// supported subset), such as "sys.Label = 'urgent' AND priority > 2".
	// "1=1" and "TRUE" are the TrueFilter, "1=0" and "FALSE" the
	// FalseFilter. A malformed expression fails [New] with
	// [ErrInvalidFilter] naming the rule.
	SQLFilter string

	// CorrelationFilter matches on equality of system and application
	// properties; nil means it is not used.
	CorrelationFilter *CorrelationFilter

	// SQLFilterParameters are the values of the @parameters SQLFilter
	// names ("sys.Label = @label"), by name with or without the @,
	// ignoring case: strings, booleans, integers, floats (and timestamps,
	// compared as text). A parameter the expression names but this map
	// lacks fails configuration. Nil means none.
	SQLFilterParameters map[string]any

	// SQLAction is an optional rule action: statements "SET <property> =
	// <expression>" and "REMOVE <property>", each optionally followed by
	// ';'. It changes the subscription's copy only.
	SQLAction string

	// SQLActionParameters are the values of SQLAction's @parameters, as
	// SQLFilterParameters are SQLFilter's.
	SQLActionParameters map[string]any
}

// CorrelationFilter matches a message whose properties equal every
// non-empty field: all conditions must hold (AND), and string comparison is
// exact. Properties compares application properties by name; the values
// must be equal after the same type normalisation as SQL filters (every
// integer type compares equal to the same int64).
type CorrelationFilter struct {
	// The system properties, by their azservicebus.Message names; Subject
	// is Service Bus's Label (sys.Label in SQL filters), SessionID the AMQP
	// group-id.
	CorrelationID    string
	MessageID        string
	To               string
	ReplyTo          string
	Subject          string
	SessionID        string
	ReplyToSessionID string
	ContentType      string
	// Properties are application properties that must all be present with
	// equal values; names ignore case, as in SQL filters.
	Properties map[string]any
}

// rule is a validated, compiled rule.
type rule struct {
	name   string
	filter func(propertySource) bool
	action []ruleStatement // nil: no action
}

// compileRules validates a subscription's rules; no rules means $Default.
func compileRules(sub string, cfgs []RuleConfig) ([]rule, error) {
	if len(cfgs) == 0 {
		cfgs = []RuleConfig{{Name: DefaultRuleName}}
	}
	seen := map[string]bool{}
	out := make([]rule, 0, len(cfgs))
	for _, c := range cfgs {
		name := c.Name
		if name == "" {
			name = DefaultRuleName
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: subscription %q rule %q: %s", ErrInvalidConfig, sub, name, fmt.Sprintf(format, args...))
		}
		if seen[strings.ToLower(name)] {
			return nil, bad("duplicate rule name")
		}
		seen[strings.ToLower(name)] = true
		r := rule{name: name}
		switch {
		case c.SQLFilter != "" && c.CorrelationFilter != nil:
			return nil, bad("set SQLFilter or CorrelationFilter, not both")
		case c.CorrelationFilter != nil:
			cf := *c.CorrelationFilter
			r.filter = func(p propertySource) bool { return matchCorrelation(cf, p) }
		case strings.TrimSpace(c.SQLFilter) != "":
			n, err := parseSQLFilterWith(c.SQLFilter, c.SQLFilterParameters)
			if err != nil {
				return nil, fmt.Errorf("%w: subscription %q rule %q: SQLFilter %q: %w", ErrInvalidConfig, sub, name, c.SQLFilter, err)
			}
			r.filter = func(p propertySource) bool { return matchSQL(n, p) }
		default:
			r.filter = func(propertySource) bool { return true }
		}
		if strings.TrimSpace(c.SQLAction) != "" {
			stmts, err := parseSQLActionWith(c.SQLAction, c.SQLActionParameters)
			if err != nil {
				return nil, fmt.Errorf("%w: subscription %q rule %q: SQLAction %q: %w", ErrInvalidConfig, sub, name, c.SQLAction, err)
			}
			r.action = stmts
		}
		out = append(out, r)
	}
	return out, nil
}

// matchCorrelation applies a correlation filter.
func matchCorrelation(cf CorrelationFilter, p propertySource) bool {
	checks := []struct{ name, want string }{
		{"correlationid", cf.CorrelationID}, {"messageid", cf.MessageID}, {"to", cf.To},
		{"replyto", cf.ReplyTo}, {"label", cf.Subject}, {"sessionid", cf.SessionID},
		{"replytosessionid", cf.ReplyToSessionID}, {"contenttype", cf.ContentType},
	}
	for _, c := range checks {
		if c.want == "" {
			continue
		}
		v, ok := p.system(c.name)
		if !ok || fmt.Sprint(v) != c.want {
			return false
		}
	}
	for name, want := range cf.Properties {
		v, ok := p.user(strings.ToLower(name))
		if !ok {
			return false
		}
		if c, ok := compareSQL(normalizeSQLValue(v), normalizeSQLValue(want)); !ok || c != 0 {
			return false
		}
	}
	return true
}

// messageProperties resolves filter properties against a stored message.
type messageProperties struct {
	m    *amqp.Message
	size int
}

func (mp messageProperties) system(name string) (any, bool) {
	m := mp.m
	props := m.Properties
	str := func(p *string) (any, bool) {
		if p == nil {
			return nil, false
		}
		return *p, true
	}
	switch name {
	case "messageid":
		if props == nil || props.MessageID == nil {
			return nil, false
		}
		return fmt.Sprint(props.MessageID), true
	case "correlationid":
		if props == nil || props.CorrelationID == nil {
			return nil, false
		}
		return fmt.Sprint(props.CorrelationID), true
	case "to":
		if props == nil {
			return nil, false
		}
		return str(props.To)
	case "replyto":
		if props == nil {
			return nil, false
		}
		return str(props.ReplyTo)
	case "label", "subject":
		if props == nil {
			return nil, false
		}
		return str(props.Subject)
	case "sessionid":
		if props == nil {
			return nil, false
		}
		return str(props.GroupID)
	case "replytosessionid":
		if props == nil {
			return nil, false
		}
		return str(props.ReplyToGroupID)
	case "contenttype":
		if props == nil {
			return nil, false
		}
		return str(props.ContentType)
	case "timetolive":
		if ttl := headerTTL(m); ttl > 0 {
			return ttl.String(), true
		}
		return nil, false
	case "deliverycount":
		if m.Header == nil {
			return int64(0), true
		}
		return int64(m.Header.DeliveryCount), true
	case "sequencenumber":
		v, ok := annotation(m, AnnotationSequenceNumber)
		return v, ok
	case "enqueuedtimeutc":
		v, _ := annotation(m, AnnotationEnqueuedTime)
		if t, isTime := v.(time.Time); isTime {
			return t.UTC().Format(time.RFC3339Nano), true
		}
		return nil, false
	case "scheduledenqueuetimeutc":
		if t, ok := scheduledEnqueueTime(m); ok {
			return t.UTC().Format(time.RFC3339Nano), true
		}
		return nil, false
	case "size":
		return int64(mp.size), true
	}
	return nil, false
}

func (mp messageProperties) user(name string) (any, bool) {
	// Property names are case-insensitive in filters; an exact match wins
	// when a message carries two spellings.
	if v, ok := mp.m.ApplicationProperties[name]; ok {
		return v, true
	}
	for k, v := range mp.m.ApplicationProperties {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return nil, false
}

// copiesFor returns the messages a subscription with rules gets for m: one
// plain copy when any action-less rule matches, plus one per matching rule
// with an action (the action applied, RuleName set). The result may be
// empty. m itself is never modified.
func copiesFor(rules []rule, m *amqp.Message, size int) []*amqp.Message {
	src := messageProperties{m: m, size: size}
	var out []*amqp.Message
	plain := false
	for _, r := range rules {
		if !r.filter(src) {
			continue
		}
		if r.action == nil {
			plain = true
			continue
		}
		c := CopyMessage(m)
		applyAction(r.action, c, size)
		if c.ApplicationProperties == nil {
			c.ApplicationProperties = map[string]any{}
		}
		c.ApplicationProperties[PropertyRuleName] = r.name
		out = append(out, c)
	}
	if plain {
		out = append([]*amqp.Message{CopyMessage(m)}, out...)
	}
	return out
}
