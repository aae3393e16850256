package sbemu

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sbretry/retry/sbemu/broker"
)

// Subscriptions and rules of the administration API; see admin_handlers.go
// for the routes.

// listSubscriptions answers GET /<topic>/Subscriptions, in creation order
// (admin_client_subscription.go builds the path with a trailing "?", which
// leaves the path itself unchanged).
func (a *adminServer) listSubscriptions(w http.ResponseWriter, r *http.Request, topic string) error {
	tc, ok := a.e.broker.TopicConfig(topic)
	if !ok {
		return apiErrorf(http.StatusNotFound, "sbemu: no topic %q", topic)
	}
	var entries []atomEntry
	for _, sc := range tc.Subscriptions {
		entries = append(entries, a.subscriptionEntry(r, tc.Name, sc))
	}
	return a.feed(w, r, "Subscriptions", entries)
}

// findSubscription returns a subscription's configuration.
func (a *adminServer) findSubscription(topic, sub string) (string, broker.SubscriptionConfig, bool) {
	tc, ok := a.e.broker.TopicConfig(topic)
	if !ok {
		return "", broker.SubscriptionConfig{}, false
	}
	for _, sc := range tc.Subscriptions {
		if strings.EqualFold(sc.Name, sub) {
			return tc.Name, sc, true
		}
	}
	return tc.Name, broker.SubscriptionConfig{}, false
}

// subscription serves /<topic>/Subscriptions/<sub>.
func (a *adminServer) subscription(w http.ResponseWriter, r *http.Request, topic, sub string) error {
	b := a.e.broker
	switch r.Method {
	case http.MethodGet:
		tn, sc, ok := a.findSubscription(topic, sub)
		if !ok {
			return apiErrorf(http.StatusNotFound, "sbemu: no subscription %q", broker.SubscriptionPath(topic, sub))
		}
		return writeXML(w, http.StatusOK, a.subscriptionEntry(r, tn, sc))
	case http.MethodPut:
		req, err := readEntry(w, r)
		if err != nil {
			return err
		}
		if req.Content.Subscription == nil {
			return apiErrorf(http.StatusBadRequest, "sbemu: PUT needs a SubscriptionDescription")
		}
		cfg, err := subscriptionConfigFrom(sub, req.Content.Subscription)
		if err != nil {
			return err
		}
		create := creating(r)
		err = a.change(func() error {
			tn, old, exists := a.findSubscription(topic, sub)
			switch {
			case tn == "":
				return apiErrorf(http.StatusNotFound, "sbemu: no topic %q", topic)
			case create && exists:
				return apiErrorf(http.StatusConflict, "sbemu: subscription %q already exists", broker.SubscriptionPath(topic, sub))
			case !create && !exists:
				return apiErrorf(http.StatusNotFound, "sbemu: no subscription %q", broker.SubscriptionPath(topic, sub))
			case !create && old.RequiresSession != cfg.RequiresSession:
				return requiresSessionFixed("Subscription")
			}
			path := broker.SubscriptionPath(tn, sub)
			settings, err := subscriptionEchoed(req.Content.Subscription).apply(a.previousLocked(path, create), create)
			if err != nil {
				return err
			}
			if create {
				err = b.AddSubscription(tn, cfg)
			} else {
				err = b.UpdateSubscription(tn, cfg)
			}
			if err != nil {
				return brokerStatus(err)
			}
			a.touchLocked(path, create, settings)
			return nil
		})
		if err != nil {
			return err
		}
		tn, sc, _ := a.findSubscription(topic, sub)
		return writeXML(w, statusFor(create), a.subscriptionEntry(r, tn, sc))
	case http.MethodDelete:
		return a.change(func() error {
			if err := b.RemoveSubscription(topic, sub); err != nil {
				return brokerStatus(err)
			}
			a.forgetLocked(broker.SubscriptionPath(topic, sub))
			w.WriteHeader(http.StatusOK)
			return nil
		})
	}
	return apiErrorf(http.StatusMethodNotAllowed, "sbemu: %s is not supported on a subscription", r.Method)
}

// subscriptionConfigFrom reads a SubscriptionDescription; its
// DefaultRuleDescription, when present, becomes the only rule.
func subscriptionConfigFrom(name string, d *subscriptionDescription) (broker.SubscriptionConfig, error) {
	cfg := broker.SubscriptionConfig{Name: name}
	if d.RequiresSession != nil {
		cfg.RequiresSession = *d.RequiresSession
	}
	var err error
	if cfg.Status, err = parseStatus(d.Status); err != nil {
		return cfg, err
	}
	bad := func(err error) error {
		return apiErrorf(http.StatusBadRequest, "sbemu: subscription %q: %v", name, err)
	}
	if cfg.LockDuration, err = parseAPIDuration("LockDuration", d.LockDuration, 0, broker.MaxLockDuration+1); err != nil {
		return cfg, bad(err)
	}
	if cfg.DefaultTTL, err = parseAPIDuration("DefaultMessageTimeToLive", d.DefaultMessageTimeToLive, 0, 0); err != nil {
		return cfg, bad(err)
	}
	if d.MaxDeliveryCount != nil {
		if *d.MaxDeliveryCount < 1 {
			return cfg, bad(fmt.Errorf("MaxDeliveryCount %d is below 1", *d.MaxDeliveryCount))
		}
		cfg.MaxDeliveryCount = int(*d.MaxDeliveryCount)
	}
	if d.DeadLetteringOnMessageExpiration != nil {
		cfg.DeadLetterOnExpiration = *d.DeadLetteringOnMessageExpiration
	}
	cfg.ForwardTo = forwardName(d.ForwardTo)
	cfg.ForwardDeadLetteredMessagesTo = forwardName(d.ForwardDeadLetteredMessagesTo)
	if d.DefaultRuleDescription != nil {
		dr := d.DefaultRuleDescription
		rc, err := ruleConfigFrom(&ruleDescription{Name: dr.Name, Filter: dr.Filter, Action: dr.Action})
		if err != nil {
			return cfg, err
		}
		cfg.Rules = []broker.RuleConfig{rc}
	}
	return cfg, nil
}

// subscriptionEntry describes a subscription with its counts. The SDK's
// newSubscriptionRuntimePropertiesItem dereferences MessageCount and four
// of the counts without checking them, so all are always present.
func (a *adminServer) subscriptionEntry(r *http.Request, topic string, sc broker.SubscriptionConfig) atomEntry {
	path := broker.SubscriptionPath(topic, sc.Name)
	var rt broker.Runtime
	if q, ok := a.e.broker.Subscription(topic, sc.Name); ok {
		rt = q.Runtime()
	}
	m := a.metaFor(path)
	lock := sc.LockDuration
	if lock == 0 {
		lock = broker.DefaultLockDuration
	}
	mdc := sc.MaxDeliveryCount
	if mdc == 0 {
		mdc = broker.DefaultMaxDeliveryCount
	}
	d := &subscriptionDescription{
		Xmlns: serviceBusNamespace, XmlnsI: xsiNamespace,
		LockDuration:                              ptr(formatISODuration(lock)),
		RequiresSession:                           ptr(sc.RequiresSession),
		DefaultMessageTimeToLive:                  ttlString(sc.DefaultTTL),
		DeadLetteringOnMessageExpiration:          ptr(sc.DeadLetterOnExpiration),
		DeadLetteringOnFilterEvaluationExceptions: ptr(false),
		MessageCount:                              ptr(int64(rt.Total())),
		MaxDeliveryCount:                          ptr(int32(mdc)),
		EnableBatchedOperations:                   ptr(!m.unbatched),
		Status:                                    statusText(sc.Status),
		ForwardTo:                                 forwardURL(r, sc.ForwardTo, m.forwardScheme),
		CreatedAt:                                 apiTime(m.created),
		UpdatedAt:                                 apiTime(m.updated),
		AccessedAt:                                apiTime(subscriptionAccessedAt(rt, m)),
		CountDetails:                              counts(rt),
		UserMetadata:                              m.userMetadata,
		ForwardDeadLetteredMessagesTo:             forwardURL(r, sc.ForwardDeadLetteredMessagesTo, m.forwardDeadLetterScheme),
		AutoDeleteOnIdle:                          m.reportedAutoDelete(),
	}
	return a.entry(r, path, sc.Name, m, d)
}

// --- rules ---

// listRules answers GET /<topic>/Subscriptions/<sub>/Rules/ (with the
// trailing slash the SDK sends, admin_client_rules.go).
func (a *adminServer) listRules(w http.ResponseWriter, r *http.Request, topic, sub string) error {
	rules, ok := a.e.broker.Rules(topic, sub)
	if !ok {
		return apiErrorf(http.StatusNotFound, "sbemu: no subscription %q", broker.SubscriptionPath(topic, sub))
	}
	var entries []atomEntry
	for _, rc := range rules {
		entries = append(entries, a.ruleEntry(r, topic, sub, rc))
	}
	return a.feed(w, r, "Rules", entries)
}

// rule serves /<topic>/Subscriptions/<sub>/Rules/<rule>.
func (a *adminServer) rule(w http.ResponseWriter, r *http.Request, topic, sub, name string) error {
	b := a.e.broker
	find := func() (broker.RuleConfig, bool, error) {
		rules, ok := b.Rules(topic, sub)
		if !ok {
			return broker.RuleConfig{}, false, apiErrorf(http.StatusNotFound, "sbemu: no subscription %q", broker.SubscriptionPath(topic, sub))
		}
		for _, rc := range rules {
			if strings.EqualFold(ruleNameOf(rc), name) {
				return rc, true, nil
			}
		}
		return broker.RuleConfig{}, false, nil
	}
	switch r.Method {
	case http.MethodGet:
		rc, ok, err := find()
		if err != nil {
			return err
		}
		if !ok {
			return apiErrorf(http.StatusNotFound, "sbemu: no rule %q on %q", name, broker.SubscriptionPath(topic, sub))
		}
		return writeXML(w, http.StatusOK, a.ruleEntry(r, topic, sub, rc))
	case http.MethodPut:
		req, err := readEntry(w, r)
		if err != nil {
			return err
		}
		if req.Content.Rule == nil {
			return apiErrorf(http.StatusBadRequest, "sbemu: PUT needs a RuleDescription")
		}
		req.Content.Rule.Name = name
		rc, err := ruleConfigFrom(req.Content.Rule)
		if err != nil {
			return err
		}
		create := creating(r)
		err = a.change(func() error {
			if create {
				err = b.AddRule(topic, sub, rc)
			} else {
				err = b.ReplaceRule(topic, sub, rc)
			}
			if err != nil {
				return brokerStatus(err)
			}
			a.touchLocked(broker.SubscriptionPath(topic, sub)+"/rules/"+name, create, echoedSettings{})
			return nil
		})
		if err != nil {
			return err
		}
		rc, _, _ = find()
		return writeXML(w, statusFor(create), a.ruleEntry(r, topic, sub, rc))
	case http.MethodDelete:
		return a.change(func() error {
			if err := b.RemoveRule(topic, sub, name); err != nil {
				return brokerStatus(err)
			}
			a.forgetLocked(broker.SubscriptionPath(topic, sub) + "/rules/" + name)
			w.WriteHeader(http.StatusOK)
			return nil
		})
	}
	return apiErrorf(http.StatusMethodNotAllowed, "sbemu: %s is not supported on a rule", r.Method)
}

// ruleNameOf names a rule as the broker does: unnamed is $Default.
func ruleNameOf(rc broker.RuleConfig) string {
	if rc.Name == "" {
		return broker.DefaultRuleName
	}
	return rc.Name
}

// ruleConfigFrom reads a RuleDescription (or DefaultRuleDescription),
// with the Parameters of a SQL filter or action, which the broker
// substitutes for their @names.
func ruleConfigFrom(d *ruleDescription) (broker.RuleConfig, error) {
	rc := broker.RuleConfig{Name: d.Name}
	bad := func(format string, args ...any) error {
		return apiErrorf(http.StatusBadRequest, "sbemu: rule %q: %s", ruleNameOf(rc), fmt.Sprintf(format, args...))
	}
	if f := d.Filter; f != nil {
		params, err := kvToMap(f.Parameters)
		if err != nil {
			return rc, bad("filter Parameters: %v", err)
		}
		rc.SQLFilterParameters = params
		switch f.TypeIn {
		case "", "TrueFilter":
		case "FalseFilter":
			rc.SQLFilter = "1=0"
		case "SqlFilter":
			if f.SQLExpression == nil {
				return rc, bad("SqlFilter without SqlExpression")
			}
			rc.SQLFilter = *f.SQLExpression
		case "CorrelationFilter":
			props, err := kvToMap(f.Properties)
			if err != nil {
				return rc, bad("%v", err)
			}
			rc.CorrelationFilter = &broker.CorrelationFilter{
				CorrelationID: deref(f.CorrelationID), MessageID: deref(f.MessageID), To: deref(f.To),
				ReplyTo: deref(f.ReplyTo), Subject: deref(f.Label), SessionID: deref(f.SessionID),
				ReplyToSessionID: deref(f.ReplyToSessionID), ContentType: deref(f.ContentType), Properties: props,
			}
		default:
			return rc, bad("filter type %q is not emulated", f.TypeIn)
		}
	}
	if ac := d.Action; ac != nil {
		params, err := kvToMap(ac.Parameters)
		if err != nil {
			return rc, bad("action Parameters: %v", err)
		}
		rc.SQLActionParameters = params
		switch ac.TypeIn {
		case "", "EmptyRuleAction":
		case "SqlRuleAction":
			rc.SQLAction = deref(ac.SQLExpression)
		default:
			return rc, bad("action type %q is not emulated", ac.TypeIn)
		}
	}
	return rc, nil
}

// deref reads an optional XML field; absent is empty.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// optional writes an optional XML field; empty is absent.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// ruleEntry describes a rule the way the service does: a TrueFilter or
// FalseFilter keeps its "1=1"/"1=0" SqlExpression, and a rule without an
// action has an EmptyRuleAction rather than no Action element, which the
// SDK would dereference (newRulePropertiesFromEnvelope).
func (a *adminServer) ruleEntry(r *http.Request, topic, sub string, rc broker.RuleConfig) atomEntry {
	name := ruleNameOf(rc)
	path := broker.SubscriptionPath(topic, sub) + "/Rules/" + name
	m := a.metaFor(broker.SubscriptionPath(topic, sub) + "/rules/" + name)
	f := &ruleFilterXML{}
	switch expr := strings.TrimSpace(rc.SQLFilter); {
	case rc.CorrelationFilter != nil:
		cf := rc.CorrelationFilter
		f.TypeOut = "CorrelationFilter"
		f.CorrelationID, f.MessageID, f.To = optional(cf.CorrelationID), optional(cf.MessageID), optional(cf.To)
		f.ReplyTo, f.Label, f.SessionID = optional(cf.ReplyTo), optional(cf.Subject), optional(cf.SessionID)
		f.ReplyToSessionID, f.ContentType = optional(cf.ReplyToSessionID), optional(cf.ContentType)
		f.Properties = mapToKV(cf.Properties)
	case expr == "" || expr == "1=1" || strings.EqualFold(expr, "TRUE"):
		f.TypeOut, f.SQLExpression, f.CompatibilityLevel = "TrueFilter", ptr("1=1"), 20
	case expr == "1=0" || strings.EqualFold(expr, "FALSE"):
		f.TypeOut, f.SQLExpression, f.CompatibilityLevel = "FalseFilter", ptr("1=0"), 20
	default:
		f.TypeOut, f.SQLExpression, f.CompatibilityLevel = "SqlFilter", ptr(rc.SQLFilter), 20
		f.Parameters = mapToKV(rc.SQLFilterParameters)
	}
	act := &ruleActionXML{TypeOut: "EmptyRuleAction"}
	if strings.TrimSpace(rc.SQLAction) != "" {
		act = &ruleActionXML{TypeOut: "SqlRuleAction", SQLExpression: ptr(rc.SQLAction), CompatibilityLevel: 20, Parameters: mapToKV(rc.SQLActionParameters)}
	}
	d := &ruleDescription{
		Xmlns: serviceBusNamespace, XmlnsI: xsiNamespace,
		Filter: f, Action: act, CreatedAt: apiTime(m.created), Name: name,
	}
	return a.entry(r, path, name, m, d)
}

// subscriptionAccessedAt is a subscription's AccessedAt: its last receive,
// or its creation before any. Unlike a new queue or topic (zero), Service
// Bus reports a new subscription as accessed (the SDK's live test
// TestAdminClient_ListSubscriptionRuntimeProperties requires a non-zero
// AccessedAt for subscriptions nobody has used).
func subscriptionAccessedAt(rt broker.Runtime, m entityMeta) time.Time {
	if rt.AccessedAt.IsZero() {
		return m.created
	}
	return rt.AccessedAt
}
