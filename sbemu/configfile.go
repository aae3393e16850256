package sbemu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sbretry/retry/sbemu/broker"
)

// Microsoft's Service Bus emulator is configured by a Config.json:
// UserConfig.Namespaces[] with Queues[] and Topics[], topics with
// Subscriptions[], subscriptions with Rules[], each entity with a
// Properties object whose durations are ISO 8601 ("PT1M"). [ConfigFromFile]
// and [ConfigFromJSON] read that file unchanged, so a project can run the
// same file against either emulator. The reader is strict: an unknown key,
// or a malformed or out-of-range value is an error naming the entity and
// the field, because a setting silently ignored is a test that silently
// lies.
//
// The property names are those Microsoft documents for the emulator and
// for the entities themselves (LockDuration, MaxDeliveryCount,
// DefaultMessageTimeToLive, DeadLetteringOnMessageExpiration,
// DuplicateDetectionHistoryTimeWindow, RequiresDuplicateDetection,
// RequiresSession, ForwardTo, ForwardDeadLetteredMessagesTo; rule
// FilterType "Sql" or "Correlation" with SqlFilter.SqlExpression or
// CorrelationFilter, and Action.SqlExpression).

// Service Bus limits the loader enforces on top of the broker's own checks
// (the shared wire notes: duplicate detection window 20 s to 7 days,
// default 10 minutes).
const (
	minDuplicateWindow     = 20 * time.Second
	maxDuplicateWindow     = 7 * 24 * time.Hour
	defaultDuplicateWindow = 10 * time.Minute
)

// ConfigFromFile reads a Config.json in the format of Microsoft's emulator;
// see [ConfigFromJSON].
func ConfigFromFile(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("sbemu: reading config: %w", err)
	}
	cfg, err := ConfigFromJSON(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ConfigFromJSON reads a configuration in the format of Microsoft's
// emulator and returns a [Config] with its Queues, Topics and
// AuthorizationRules set (every other field zero, for the caller to fill
// in). AuthorizationRules, in the namespace object, is sbemu's addition
// (see authorizationRuleFromJSON). The file must describe
// exactly one namespace, as Microsoft's emulator serves one; its name is
// not used. The entities are validated as [Start] would validate them, so
// a configuration that loads also starts.
func ConfigFromJSON(data []byte) (Config, error) {
	var file struct {
		UserConfig *struct {
			Namespaces []json.RawMessage
			// Logging configures where Microsoft's emulator writes its logs; it
			// has no meaning here and is accepted so the file loads unchanged.
			Logging json.RawMessage
		}
	}
	if err := decodeStrict(blankComments(data), &file); err != nil {
		return Config{}, fmt.Errorf("sbemu: config: %w", err)
	}
	if file.UserConfig == nil {
		return Config{}, errors.New("sbemu: config: no UserConfig object")
	}
	if n := len(file.UserConfig.Namespaces); n != 1 {
		return Config{}, fmt.Errorf("sbemu: config: UserConfig.Namespaces has %d entries; the emulator serves exactly one namespace", n)
	}
	var ns struct {
		Name   string
		Queues []json.RawMessage
		Topics []json.RawMessage
		// AuthorizationRules is sbemu's own addition to the format (see
		// authorizationRulesFromJSON); Microsoft's emulator has no such key.
		AuthorizationRules []json.RawMessage
	}
	if err := decodeStrict(file.UserConfig.Namespaces[0], &ns); err != nil {
		return Config{}, fmt.Errorf("sbemu: config: namespace: %w", err)
	}
	var cfg Config
	for i, raw := range ns.Queues {
		q, err := queueFromJSON(raw)
		if err != nil {
			return Config{}, fmt.Errorf("sbemu: config: Queues[%d]: %w", i, err)
		}
		cfg.Queues = append(cfg.Queues, q)
	}
	for i, raw := range ns.Topics {
		t, err := topicFromJSON(raw)
		if err != nil {
			return Config{}, fmt.Errorf("sbemu: config: Topics[%d]: %w", i, err)
		}
		cfg.Topics = append(cfg.Topics, t)
	}
	for i, raw := range ns.AuthorizationRules {
		rule, err := authorizationRuleFromJSON(raw)
		if err != nil {
			return Config{}, fmt.Errorf("sbemu: config: AuthorizationRules[%d]: %w", i, err)
		}
		cfg.AuthorizationRules = append(cfg.AuthorizationRules, rule)
	}
	// Empty names, missing keys, unknown rights and duplicate names are
	// reported now; a clash with Config.KeyName only [Start] can see.
	if _, err := namespacePolicies(Config{AuthorizationRules: cfg.AuthorizationRules}); err != nil {
		return Config{}, fmt.Errorf("sbemu: config: %w", err)
	}
	// The broker's validation covers names, limits, rules and forwarding
	// targets and names the entity; running it here reports those problems
	// when the file is read, not when the emulator starts.
	b, err := broker.New(broker.Options{Topics: cfg.Topics}, cfg.Queues...)
	if err != nil {
		return Config{}, fmt.Errorf("sbemu: config: %w", err)
	}
	b.Close()
	return cfg, nil
}

// authorizationRuleFromJSON reads one entry of the namespace's
// AuthorizationRules, an sbemu extension of Microsoft's format (which has
// no way to configure keys: its emulator accepts any token):
//
//	"AuthorizationRules": [
//	  {"KeyName": "listen-only", "PrimaryKey": "…", "SecondaryKey": "…", "Rights": ["Listen"]}
//	]
//
// The names are those of Service Bus's own SharedAccessAuthorizationRule
// (ARM and the administration API); SecondaryKey is optional. Each becomes
// a [Config.AuthorizationRules] entry, checked under [Config.StrictAuth].
func authorizationRuleFromJSON(raw json.RawMessage) (AuthorizationRule, error) {
	var r struct {
		KeyName                  string
		PrimaryKey, SecondaryKey string
		Rights                   []string
	}
	if err := decodeStrict(raw, &r); err != nil {
		return AuthorizationRule{}, err
	}
	rule := AuthorizationRule{KeyName: r.KeyName, PrimaryKey: r.PrimaryKey, SecondaryKey: r.SecondaryKey}
	for _, right := range r.Rights {
		rule.Rights = append(rule.Rights, AccessRight(right))
	}
	return rule, nil
}

// decodeStrict decodes one JSON value, refusing unknown keys and trailing
// data. Key matching ignores case, as encoding/json does.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

// entityJSON is the shape shared by queues, topics, subscriptions and rules.
type entityJSON struct {
	Name          string
	Properties    json.RawMessage
	Subscriptions []json.RawMessage // topics only
	Rules         []json.RawMessage // subscriptions only
}

// decodeEntity reads an entity object; only the listed child arrays may be
// present. what names the kind for errors.
func decodeEntity(raw json.RawMessage, what string, subscriptions, rules bool) (entityJSON, error) {
	var e entityJSON
	if err := decodeStrict(raw, &e); err != nil {
		return e, fmt.Errorf("%s: %w", what, err)
	}
	if strings.TrimSpace(e.Name) == "" {
		return e, fmt.Errorf("%s: missing Name", what)
	}
	if e.Subscriptions != nil && !subscriptions {
		return e, fmt.Errorf("%s %q: Subscriptions is only allowed on a topic", what, e.Name)
	}
	if e.Rules != nil && !rules {
		return e, fmt.Errorf("%s %q: Rules is only allowed on a subscription", what, e.Name)
	}
	return e, nil
}

// entityProperties holds every property a queue, topic or subscription may
// set; which ones are allowed depends on the kind (see allowedProperties).
// Pointers tell "absent" from "zero".
type entityProperties struct {
	DeadLetteringOnMessageExpiration    *bool
	DefaultMessageTimeToLive            *string
	DuplicateDetectionHistoryTimeWindow *string
	ForwardDeadLetteredMessagesTo       *string
	ForwardTo                           *string
	LockDuration                        *string
	MaxDeliveryCount                    *int
	RequiresDuplicateDetection          *bool
	RequiresSession                     *bool
}

// allowedProperties lists, per kind, the properties Service Bus has on that
// entity; the others are refused by name.
var allowedProperties = map[string][]string{
	"queue": {"DeadLetteringOnMessageExpiration", "DefaultMessageTimeToLive", "DuplicateDetectionHistoryTimeWindow",
		"ForwardDeadLetteredMessagesTo", "ForwardTo", "LockDuration", "MaxDeliveryCount", "RequiresDuplicateDetection", "RequiresSession"},
	"topic": {"DefaultMessageTimeToLive", "DuplicateDetectionHistoryTimeWindow", "RequiresDuplicateDetection"},
	"subscription": {"DeadLetteringOnMessageExpiration", "DefaultMessageTimeToLive", "ForwardDeadLetteredMessagesTo",
		"ForwardTo", "LockDuration", "MaxDeliveryCount", "RequiresSession"},
}

// settings is what the properties of one entity translate to.
type settings struct {
	lock, ttl, dedup time.Duration
	maxDelivery      int
	dlOnExpiry       bool
	requiresSession  bool
	forwardTo, fwdDL string
}

// readProperties decodes and checks an entity's Properties; absent means
// every default.
func readProperties(raw json.RawMessage, what, name string) (settings, error) {
	var s settings
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return s, nil
	}
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%s %q: %s: %s", what, name, field, fmt.Sprintf(format, args...))
	}
	// Keys are checked against the kind first, so a queue-only property on a
	// topic is named as such instead of as a generic unknown key.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return s, fmt.Errorf("%s %q: Properties: %w", what, name, err)
	}
	for k := range keys {
		if !containsFold(allowedProperties[what], k) {
			return s, bad(k, "not a property of a %s (allowed: %s)", what, strings.Join(allowedProperties[what], ", "))
		}
	}
	var p entityProperties
	if err := decodeStrict(raw, &p); err != nil {
		return s, fmt.Errorf("%s %q: Properties: %w", what, name, err)
	}
	duration := func(field string, v *string) (time.Duration, error) {
		d, err := parseISODuration(*v)
		if err != nil {
			return 0, bad(field, "%v", err)
		}
		if d <= 0 {
			return 0, bad(field, "%q must be positive", *v)
		}
		return d, nil
	}
	var err error
	if p.RequiresSession != nil {
		s.requiresSession = *p.RequiresSession
	}
	if v := p.LockDuration; v != nil {
		if s.lock, err = duration("LockDuration", v); err != nil {
			return s, err
		}
		if s.lock > broker.MaxLockDuration {
			return s, bad("LockDuration", "%q exceeds the Service Bus maximum of %v", *v, broker.MaxLockDuration)
		}
	}
	if v := p.DefaultMessageTimeToLive; v != nil {
		d, perr := parseISODuration(*v)
		switch {
		case errors.Is(perr, errDurationTooLong):
			// .NET's TimeSpan.MaxValue, which Microsoft's tools write for "never".
			s.ttl = 0
		case perr != nil:
			return s, bad("DefaultMessageTimeToLive", "%v", perr)
		case d <= 0:
			return s, bad("DefaultMessageTimeToLive", "%q must be positive", *v)
		default:
			s.ttl = d
		}
	}
	if p.RequiresDuplicateDetection != nil && *p.RequiresDuplicateDetection {
		s.dedup = defaultDuplicateWindow
		if v := p.DuplicateDetectionHistoryTimeWindow; v != nil {
			if s.dedup, err = duration("DuplicateDetectionHistoryTimeWindow", v); err != nil {
				return s, err
			}
			if s.dedup < minDuplicateWindow || s.dedup > maxDuplicateWindow {
				return s, bad("DuplicateDetectionHistoryTimeWindow", "%q is outside the Service Bus range %v to %v", *v, minDuplicateWindow, maxDuplicateWindow)
			}
		}
	} else if v := p.DuplicateDetectionHistoryTimeWindow; v != nil {
		// Without RequiresDuplicateDetection the window is ignored, as on
		// Service Bus; it must still be well-formed.
		if _, err := duration("DuplicateDetectionHistoryTimeWindow", v); err != nil {
			return s, err
		}
	}
	if v := p.MaxDeliveryCount; v != nil {
		if *v < 1 {
			return s, bad("MaxDeliveryCount", "%d must be at least 1", *v)
		}
		s.maxDelivery = *v
	}
	if p.DeadLetteringOnMessageExpiration != nil {
		s.dlOnExpiry = *p.DeadLetteringOnMessageExpiration
	}
	if p.ForwardTo != nil {
		s.forwardTo = strings.TrimSpace(*p.ForwardTo)
	}
	if p.ForwardDeadLetteredMessagesTo != nil {
		s.fwdDL = strings.TrimSpace(*p.ForwardDeadLetteredMessagesTo)
	}
	return s, nil
}

// containsFold reports whether list holds s ignoring case, the way
// encoding/json matches keys.
func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

// queueFromJSON reads one Queues[] entry. Zero settings stay zero, so the
// broker applies the same defaults as for a queue configured in Go.
func queueFromJSON(raw json.RawMessage) (broker.QueueConfig, error) {
	e, err := decodeEntity(raw, "queue", false, false)
	if err != nil {
		return broker.QueueConfig{}, err
	}
	s, err := readProperties(e.Properties, "queue", e.Name)
	if err != nil {
		return broker.QueueConfig{}, err
	}
	return broker.QueueConfig{
		Name:                          e.Name,
		LockDuration:                  s.lock,
		MaxDeliveryCount:              s.maxDelivery,
		DuplicateDetectionWindow:      s.dedup,
		DefaultTTL:                    s.ttl,
		DeadLetterOnExpiration:        s.dlOnExpiry,
		RequiresSession:               s.requiresSession,
		ForwardTo:                     s.forwardTo,
		ForwardDeadLetteredMessagesTo: s.fwdDL,
	}, nil
}

// topicFromJSON reads one Topics[] entry with its subscriptions; errors
// inside a subscription are prefixed with the topic and the index, so the
// message leads to the line in the file.
func topicFromJSON(raw json.RawMessage) (broker.TopicConfig, error) {
	e, err := decodeEntity(raw, "topic", true, false)
	if err != nil {
		return broker.TopicConfig{}, err
	}
	s, err := readProperties(e.Properties, "topic", e.Name)
	if err != nil {
		return broker.TopicConfig{}, err
	}
	t := broker.TopicConfig{Name: e.Name, DuplicateDetectionWindow: s.dedup, DefaultTTL: s.ttl}
	for i, sraw := range e.Subscriptions {
		sub, err := subscriptionFromJSON(sraw)
		if err != nil {
			return broker.TopicConfig{}, fmt.Errorf("topic %q: Subscriptions[%d]: %w", e.Name, i, err)
		}
		t.Subscriptions = append(t.Subscriptions, sub)
	}
	return t, nil
}

// subscriptionFromJSON reads one Subscriptions[] entry with its rules.
func subscriptionFromJSON(raw json.RawMessage) (broker.SubscriptionConfig, error) {
	e, err := decodeEntity(raw, "subscription", false, true)
	if err != nil {
		return broker.SubscriptionConfig{}, err
	}
	s, err := readProperties(e.Properties, "subscription", e.Name)
	if err != nil {
		return broker.SubscriptionConfig{}, err
	}
	sub := broker.SubscriptionConfig{
		Name:                          e.Name,
		LockDuration:                  s.lock,
		MaxDeliveryCount:              s.maxDelivery,
		DefaultTTL:                    s.ttl,
		DeadLetterOnExpiration:        s.dlOnExpiry,
		RequiresSession:               s.requiresSession,
		ForwardTo:                     s.forwardTo,
		ForwardDeadLetteredMessagesTo: s.fwdDL,
	}
	for i, rraw := range e.Rules {
		r, err := ruleFromJSON(rraw)
		if err != nil {
			return broker.SubscriptionConfig{}, fmt.Errorf("subscription %q: Rules[%d]: %w", e.Name, i, err)
		}
		sub.Rules = append(sub.Rules, r)
	}
	return sub, nil
}

// ruleJSON is a rule's Properties object; field names follow the file's
// spelling (CorrelationId, not CorrelationID).
type ruleJSON struct {
	FilterType string
	SqlFilter  *struct {
		SqlExpression string
	}
	CorrelationFilter *struct {
		ContentType      string
		CorrelationId    string
		Label            string
		MessageId        string
		ReplyTo          string
		ReplyToSessionId string
		SessionId        string
		To               string
		Properties       map[string]any
	}
	Action *struct {
		SqlExpression string
	}
}

// ruleFromJSON reads one Rules[] entry. FilterType decides which filter
// object must be present, and the other must not be, so a rule never
// silently filters differently from what the file seems to say. The SQL
// itself is checked by the broker when the configuration is validated.
func ruleFromJSON(raw json.RawMessage) (broker.RuleConfig, error) {
	var e struct {
		Name       string
		Properties json.RawMessage
	}
	if err := decodeStrict(raw, &e); err != nil {
		return broker.RuleConfig{}, fmt.Errorf("rule: %w", err)
	}
	if strings.TrimSpace(e.Name) == "" {
		return broker.RuleConfig{}, errors.New("rule: missing Name")
	}
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("rule %q: %s: %s", e.Name, field, fmt.Sprintf(format, args...))
	}
	var p ruleJSON
	if len(bytes.TrimSpace(e.Properties)) > 0 {
		if err := decodeStrict(e.Properties, &p); err != nil {
			return broker.RuleConfig{}, fmt.Errorf("rule %q: Properties: %w", e.Name, err)
		}
	}
	r := broker.RuleConfig{Name: e.Name}
	switch strings.ToLower(p.FilterType) {
	case "sql":
		if p.SqlFilter == nil || strings.TrimSpace(p.SqlFilter.SqlExpression) == "" {
			return r, bad("SqlFilter.SqlExpression", "required when FilterType is %q", p.FilterType)
		}
		if p.CorrelationFilter != nil {
			return r, bad("CorrelationFilter", "not allowed when FilterType is %q", p.FilterType)
		}
		r.SQLFilter = p.SqlFilter.SqlExpression
	case "correlation":
		if p.CorrelationFilter == nil {
			return r, bad("CorrelationFilter", "required when FilterType is %q", p.FilterType)
		}
		if p.SqlFilter != nil {
			return r, bad("SqlFilter", "not allowed when FilterType is %q", p.FilterType)
		}
		cf := p.CorrelationFilter
		r.CorrelationFilter = &broker.CorrelationFilter{
			CorrelationID: cf.CorrelationId, MessageID: cf.MessageId, To: cf.To, ReplyTo: cf.ReplyTo,
			Subject: cf.Label, SessionID: cf.SessionId, ReplyToSessionID: cf.ReplyToSessionId,
			ContentType: cf.ContentType, Properties: cf.Properties,
		}
	case "":
		if p.SqlFilter != nil || p.CorrelationFilter != nil {
			return r, bad("FilterType", `missing: say "Sql" or "Correlation"`)
		}
		// No filter at all: the TrueFilter, as a rule created without one is.
	default:
		return r, bad("FilterType", `%q is neither "Sql" nor "Correlation"`, p.FilterType)
	}
	if p.Action != nil {
		r.SQLAction = p.Action.SqlExpression
	}
	return r, nil
}

// blankComments returns data with every "//" comment (to the end of its
// line, outside JSON strings) overwritten with spaces. Microsoft's emulator
// ships its default Config.json with "//" comment lines and reads it
// leniently; encoding/json does not, and refused that file with "invalid
// character '/'". Blanking rather than removing keeps the byte offsets of
// any later syntax error pointing at the right place. A "//" inside a
// string ("sb://host/queue") is data, not a comment. data is not modified.
func blankComments(data []byte) []byte {
	var out []byte // copied on the first comment only
	inString, escaped := false, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '/' && i+1 < len(data) && data[i+1] == '/':
			if out == nil {
				out = bytes.Clone(data)
			}
			for ; i < len(data) && data[i] != '\n'; i++ {
				out[i] = ' '
			}
		}
	}
	if out == nil {
		return data
	}
	return out
}
