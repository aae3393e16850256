package sbemu

import (
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The ATOM documents of the administration API. The shapes follow what the
// SDK marshals and unmarshals (azservicebus v1.11.0 internal/atom/atom.go
// and models.go): an Atom <entry> whose <content type="application/xml">
// holds a QueueDescription, TopicDescription, SubscriptionDescription or
// RuleDescription in the Service Bus namespace, and a <feed> of such
// entries for listings. Go's decoder matches elements by local name in any
// namespace; attributes in the XML Schema instance namespace (i:type on
// filters, actions and values) are matched by namespace, so they are written
// with an explicit "i" prefix declared on the description.

const (
	atomNamespace       = "http://www.w3.org/2005/Atom"
	serviceBusNamespace = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
	xsiNamespace        = "http://www.w3.org/2001/XMLSchema-instance"
	xsdNamespace        = "http://www.w3.org/2001/XMLSchema"

	// timeSpanMax is .NET's TimeSpan.MaxValue, which the service reports
	// for "no default time-to-live" and "never auto-delete".
	timeSpanMax = "P10675199DT2H48M5.4775807S"

	// maxSizeInMegabytes is the entity size reported; the emulator keeps
	// no size quota.
	maxSizeInMegabytes = 1024
)

// atomEntry is an entry as the emulator writes it.
type atomEntry struct {
	XMLName   xml.Name    `xml:"entry"`
	Xmlns     string      `xml:"xmlns,attr"`
	ID        string      `xml:"id"`
	Title     atomText    `xml:"title"`
	Published string      `xml:"published,omitempty"`
	Updated   string      `xml:"updated"`
	Author    *atomAuthor `xml:"author,omitempty"`
	Link      atomLink    `xml:"link"`
	Content   atomContent `xml:"content"`
}

// atomText is a text construct such as <title type="text">orders</title>;
// the SDK reads the entity name from it (env.Title).
type atomText struct {
	Type string `xml:"type,attr"`
	Text string `xml:",chardata"`
}

// atomAuthor names the namespace, as the service does.
type atomAuthor struct {
	Name string `xml:"name"`
}

// atomLink is the entry's self link.
type atomLink struct {
	Rel  string `xml:"rel,attr"`
	Href string `xml:"href,attr"`
}

// atomContent holds one description. Body is marshalled under its own
// XMLName, so one type serves every entity kind.
type atomContent struct {
	Type string `xml:"type,attr"`
	Body any    // a *queueDescription, *topicDescription, ... named by its XMLName
}

// atomFeed is a listing.
type atomFeed struct {
	XMLName xml.Name    `xml:"feed"`
	Xmlns   string      `xml:"xmlns,attr"`
	Title   atomText    `xml:"title"`
	ID      string      `xml:"id"`
	Updated string      `xml:"updated"`
	Link    atomLink    `xml:"link"`
	Entries []atomEntry `xml:"entry"`
}

// atomRequest is an entry as a client sends it in a PUT.
type atomRequest struct {
	Content struct {
		Queue        *queueDescription        `xml:"QueueDescription"`
		Topic        *topicDescription        `xml:"TopicDescription"`
		Subscription *subscriptionDescription `xml:"SubscriptionDescription"`
		Rule         *ruleDescription         `xml:"RuleDescription"`
	} `xml:"content"`
}

// countDetails is the CountDetails element of runtime properties. The
// subscription converter dereferences every count (admin_client_subscription.go,
// newSubscriptionRuntimePropertiesItem), so all five are always written.
//
// The counts are in the 2011/06 Service Bus namespace, as the service
// writes them (its d2p1 prefix): the Go SDK matches them by local name, but
// clients that resolve namespaces (the Python SDK's deserialiser) look them
// up there.
type countDetails struct {
	ActiveMessageCount             int32 `xml:"http://schemas.microsoft.com/netservices/2011/06/servicebus ActiveMessageCount"`
	DeadLetterMessageCount         int32 `xml:"http://schemas.microsoft.com/netservices/2011/06/servicebus DeadLetterMessageCount"`
	ScheduledMessageCount          int32 `xml:"http://schemas.microsoft.com/netservices/2011/06/servicebus ScheduledMessageCount"`
	TransferMessageCount           int32 `xml:"http://schemas.microsoft.com/netservices/2011/06/servicebus TransferMessageCount"`
	TransferDeadLetterMessageCount int32 `xml:"http://schemas.microsoft.com/netservices/2011/06/servicebus TransferDeadLetterMessageCount"`
}

// queueDescription mirrors atom.QueueDescription for the fields the
// emulator reads or reports.
type queueDescription struct {
	XMLName                             xml.Name               `xml:"QueueDescription"`
	Xmlns                               string                 `xml:"xmlns,attr,omitempty"`
	XmlnsI                              string                 `xml:"xmlns:i,attr,omitempty"`
	LockDuration                        *string                `xml:"LockDuration,omitempty"`
	MaxSizeInMegabytes                  *int32                 `xml:"MaxSizeInMegabytes,omitempty"`
	RequiresDuplicateDetection          *bool                  `xml:"RequiresDuplicateDetection,omitempty"`
	RequiresSession                     *bool                  `xml:"RequiresSession,omitempty"`
	DefaultMessageTimeToLive            *string                `xml:"DefaultMessageTimeToLive,omitempty"`
	DeadLetteringOnMessageExpiration    *bool                  `xml:"DeadLetteringOnMessageExpiration,omitempty"`
	DuplicateDetectionHistoryTimeWindow *string                `xml:"DuplicateDetectionHistoryTimeWindow,omitempty"`
	MaxDeliveryCount                    *int32                 `xml:"MaxDeliveryCount,omitempty"`
	EnableBatchedOperations             *bool                  `xml:"EnableBatchedOperations,omitempty"`
	SizeInBytes                         *int64                 `xml:"SizeInBytes,omitempty"`
	MessageCount                        *int64                 `xml:"MessageCount,omitempty"`
	AuthorizationRules                  []authorizationRuleXML `xml:"AuthorizationRules>AuthorizationRule,omitempty"`
	Status                              *string                `xml:"Status,omitempty"`
	ForwardTo                           *string                `xml:"ForwardTo,omitempty"`
	CreatedAt                           string                 `xml:"CreatedAt,omitempty"`
	UpdatedAt                           string                 `xml:"UpdatedAt,omitempty"`
	AccessedAt                          string                 `xml:"AccessedAt,omitempty"`
	SupportOrdering                     *bool                  `xml:"SupportOrdering,omitempty"`
	CountDetails                        *countDetails          `xml:"CountDetails,omitempty"`
	AutoDeleteOnIdle                    *string                `xml:"AutoDeleteOnIdle,omitempty"`
	EnablePartitioning                  *bool                  `xml:"EnablePartitioning,omitempty"`
	ForwardDeadLetteredMessagesTo       *string                `xml:"ForwardDeadLetteredMessagesTo,omitempty"`
	UserMetadata                        *string                `xml:"UserMetadata,omitempty"`
	MaxMessageSizeInKilobytes           *int64                 `xml:"MaxMessageSizeInKilobytes,omitempty"`
}

// topicDescription mirrors atom.TopicDescription.
type topicDescription struct {
	XMLName                             xml.Name               `xml:"TopicDescription"`
	Xmlns                               string                 `xml:"xmlns,attr,omitempty"`
	XmlnsI                              string                 `xml:"xmlns:i,attr,omitempty"`
	DefaultMessageTimeToLive            *string                `xml:"DefaultMessageTimeToLive,omitempty"`
	MaxSizeInMegabytes                  *int32                 `xml:"MaxSizeInMegabytes,omitempty"`
	RequiresDuplicateDetection          *bool                  `xml:"RequiresDuplicateDetection,omitempty"`
	DuplicateDetectionHistoryTimeWindow *string                `xml:"DuplicateDetectionHistoryTimeWindow,omitempty"`
	EnableBatchedOperations             *bool                  `xml:"EnableBatchedOperations,omitempty"`
	SizeInBytes                         *int64                 `xml:"SizeInBytes,omitempty"`
	FilteringMessagesBeforePublishing   *bool                  `xml:"FilteringMessagesBeforePublishing,omitempty"`
	AuthorizationRules                  []authorizationRuleXML `xml:"AuthorizationRules>AuthorizationRule,omitempty"`
	Status                              *string                `xml:"Status,omitempty"`
	UserMetadata                        *string                `xml:"UserMetadata,omitempty"`
	CreatedAt                           string                 `xml:"CreatedAt,omitempty"`
	UpdatedAt                           string                 `xml:"UpdatedAt,omitempty"`
	AccessedAt                          string                 `xml:"AccessedAt,omitempty"`
	SupportOrdering                     *bool                  `xml:"SupportOrdering,omitempty"`
	CountDetails                        *countDetails          `xml:"CountDetails,omitempty"`
	SubscriptionCount                   *int32                 `xml:"SubscriptionCount,omitempty"`
	AutoDeleteOnIdle                    *string                `xml:"AutoDeleteOnIdle,omitempty"`
	EnablePartitioning                  *bool                  `xml:"EnablePartitioning,omitempty"`
	SQLFilterCount                      *int32                 `xml:"SqlFilterCount,omitempty"`
	CorrelationFilterCount              *int32                 `xml:"CorrelationFilterCount,omitempty"`
	MaxMessageSizeInKilobytes           *int64                 `xml:"MaxMessageSizeInKilobytes,omitempty"`
}

// subscriptionDescription mirrors atom.SubscriptionDescription.
type subscriptionDescription struct {
	XMLName                                   xml.Name        `xml:"SubscriptionDescription"`
	Xmlns                                     string          `xml:"xmlns,attr,omitempty"`
	XmlnsI                                    string          `xml:"xmlns:i,attr,omitempty"`
	LockDuration                              *string         `xml:"LockDuration,omitempty"`
	RequiresSession                           *bool           `xml:"RequiresSession,omitempty"`
	DefaultMessageTimeToLive                  *string         `xml:"DefaultMessageTimeToLive,omitempty"`
	DeadLetteringOnMessageExpiration          *bool           `xml:"DeadLetteringOnMessageExpiration,omitempty"`
	DeadLetteringOnFilterEvaluationExceptions *bool           `xml:"DeadLetteringOnFilterEvaluationExceptions,omitempty"`
	DefaultRuleDescription                    *defaultRuleXML `xml:"DefaultRuleDescription,omitempty"`
	MessageCount                              *int64          `xml:"MessageCount,omitempty"`
	MaxDeliveryCount                          *int32          `xml:"MaxDeliveryCount,omitempty"`
	EnableBatchedOperations                   *bool           `xml:"EnableBatchedOperations,omitempty"`
	Status                                    *string         `xml:"Status,omitempty"`
	ForwardTo                                 *string         `xml:"ForwardTo,omitempty"`
	CreatedAt                                 string          `xml:"CreatedAt,omitempty"`
	UpdatedAt                                 string          `xml:"UpdatedAt,omitempty"`
	AccessedAt                                string          `xml:"AccessedAt,omitempty"`
	CountDetails                              *countDetails   `xml:"CountDetails,omitempty"`
	UserMetadata                              *string         `xml:"UserMetadata,omitempty"`
	ForwardDeadLetteredMessagesTo             *string         `xml:"ForwardDeadLetteredMessagesTo,omitempty"`
	AutoDeleteOnIdle                          *string         `xml:"AutoDeleteOnIdle,omitempty"`
}

// ruleDescription mirrors atom.RuleDescription (and DefaultRuleDescription,
// which has the same children). The SDK dereferences Filter and Action of
// every rule it reads (admin_client_rules.go, newRulePropertiesFromEnvelope),
// so both are always written.
type ruleDescription struct {
	XMLName   xml.Name       `xml:"RuleDescription"`
	Xmlns     string         `xml:"xmlns,attr,omitempty"`
	XmlnsI    string         `xml:"xmlns:i,attr,omitempty"`
	Filter    *ruleFilterXML `xml:"Filter"`
	Action    *ruleActionXML `xml:"Action"`
	CreatedAt string         `xml:"CreatedAt,omitempty"`
	Name      string         `xml:"Name"`
}

// defaultRuleXML is the DefaultRuleDescription of a subscription being
// created: its only rule.
type defaultRuleXML struct {
	Filter *ruleFilterXML `xml:"Filter"`
	Action *ruleActionXML `xml:"Action"`
	Name   string         `xml:"Name"`
}

// ruleFilterXML is a Filter element. TypeIn reads the i:type attribute by
// namespace; TypeOut writes it with the "i" prefix.
type ruleFilterXML struct {
	TypeIn             string     `xml:"http://www.w3.org/2001/XMLSchema-instance type,attr,omitempty"`
	TypeOut            string     `xml:"i:type,attr,omitempty"`
	CorrelationID      *string    `xml:"CorrelationId,omitempty"`
	MessageID          *string    `xml:"MessageId,omitempty"`
	To                 *string    `xml:"To,omitempty"`
	ReplyTo            *string    `xml:"ReplyTo,omitempty"`
	Label              *string    `xml:"Label,omitempty"`
	SessionID          *string    `xml:"SessionId,omitempty"`
	ReplyToSessionID   *string    `xml:"ReplyToSessionId,omitempty"`
	ContentType        *string    `xml:"ContentType,omitempty"`
	Properties         *kvListXML `xml:"Properties,omitempty"`
	SQLExpression      *string    `xml:"SqlExpression,omitempty"`
	CompatibilityLevel int        `xml:"CompatibilityLevel,omitempty"`
	Parameters         *kvListXML `xml:"Parameters,omitempty"`
}

// ruleActionXML is an Action element.
type ruleActionXML struct {
	TypeIn             string     `xml:"http://www.w3.org/2001/XMLSchema-instance type,attr,omitempty"`
	TypeOut            string     `xml:"i:type,attr,omitempty"`
	SQLExpression      *string    `xml:"SqlExpression,omitempty"`
	CompatibilityLevel int        `xml:"CompatibilityLevel,omitempty"`
	Parameters         *kvListXML `xml:"Parameters,omitempty"`
}

// kvListXML is a .NET dictionary as the data contract serialiser writes
// it: correlation filter Properties and SQL Parameters.
type kvListXML struct {
	Items []kvXML `xml:"KeyValueOfstringanyType"`
}

// kvXML is one dictionary entry.
type kvXML struct {
	Key   string     `xml:"Key"`
	Value kvValueXML `xml:"Value"`
}

// kvValueXML is a typed value; its i:type names an XML Schema type
// ("d6p1:string", "d6p1:int", ...), of which the SDK reads the part after
// the colon.
type kvValueXML struct {
	TypeIn  string `xml:"http://www.w3.org/2001/XMLSchema-instance type,attr,omitempty"`
	TypeOut string `xml:"i:type,attr,omitempty"`
	XmlnsD  string `xml:"xmlns:d6p1,attr,omitempty"`
	Text    string `xml:",chardata"`
}

// namespaceInfo answers GET /$namespaceinfo (admin_client.go,
// GetNamespaceProperties).
type namespaceInfo struct {
	XMLName       xml.Name `xml:"NamespaceInfo"`
	Xmlns         string   `xml:"xmlns,attr"`
	CreatedTime   string   `xml:"CreatedTime"`
	MessagingSKU  string   `xml:"MessagingSKU"`
	ModifiedTime  string   `xml:"ModifiedTime"`
	Name          string   `xml:"Name"`
	NamespaceType string   `xml:"NamespaceType"`
}

// apiTime formats a time as the API does: RFC 3339 in UTC, which
// atom.StringToTime parses.
func apiTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// formatISODuration writes d as an ISO 8601 duration the way .NET's
// XmlConvert does ("PT1M", "PT30S", "P14D", "PT0.5S").
func formatISODuration(d time.Duration) string {
	if d <= 0 {
		return "PT0S"
	}
	var b strings.Builder
	b.WriteByte('P')
	if days := d / (24 * time.Hour); days > 0 {
		fmt.Fprintf(&b, "%dD", days)
		d -= days * 24 * time.Hour
	}
	if d == 0 {
		return b.String()
	}
	b.WriteByte('T')
	if h := d / time.Hour; h > 0 {
		fmt.Fprintf(&b, "%dH", h)
		d -= h * time.Hour
	}
	if m := d / time.Minute; m > 0 {
		fmt.Fprintf(&b, "%dM", m)
		d -= m * time.Minute
	}
	if d > 0 {
		b.WriteString(strconv.FormatFloat(d.Seconds(), 'f', -1, 64))
		b.WriteByte('S')
	}
	return b.String()
}

// ttlString reports a default time-to-live, zero meaning never.
func ttlString(d time.Duration) *string {
	if d <= 0 {
		return ptr(timeSpanMax)
	}
	return ptr(formatISODuration(d))
}

// parseAPIDuration reads an optional duration field; nil gives def, and
// TimeSpan.MaxValue (or anything beyond time.Duration) gives never.
func parseAPIDuration(field string, s *string, def, never time.Duration) (time.Duration, error) {
	if s == nil || strings.TrimSpace(*s) == "" {
		return def, nil
	}
	d, err := parseISODuration(*s)
	if errors.Is(err, errDurationTooLong) {
		return never, nil
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", field, err)
	}
	return d, nil
}

// forwardName reduces a ForwardTo value to an entity name: the SDK passes
// through what the caller wrote, a name or (as the service reports it) an
// absolute URL such as "https://ns.servicebus.windows.net/orders".
func forwardName(s *string) string {
	if s == nil {
		return ""
	}
	v := strings.TrimSpace(*s)
	if u, err := url.Parse(v); err == nil && u.Scheme != "" && u.Host != "" {
		v = strings.TrimPrefix(u.Path, "/")
	}
	return strings.TrimSuffix(v, "/")
}

// kvToMap converts Properties or Parameters to Go values as the SDK's
// internalSQLParametersToPublic does (admin_client_rules.go): string,
// boolean, int (int64), double (float64) and dateTime (time.Time).
func kvToMap(kv *kvListXML) (map[string]any, error) {
	if kv == nil || len(kv.Items) == 0 {
		return nil, nil
	}
	out := make(map[string]any, len(kv.Items))
	for _, p := range kv.Items {
		typ := p.Value.TypeIn
		if i := strings.LastIndexByte(typ, ':'); i >= 0 {
			typ = typ[i+1:]
		}
		var (
			v   any
			err error
		)
		switch typ {
		case "string":
			v = p.Value.Text
		case "boolean":
			v, err = strconv.ParseBool(p.Value.Text)
		case "int", "long", "short", "byte":
			v, err = strconv.ParseInt(p.Value.Text, 10, 64)
		case "double", "float", "decimal":
			v, err = strconv.ParseFloat(p.Value.Text, 64)
		case "dateTime":
			v, err = time.Parse(time.RFC3339Nano, p.Value.Text)
		default:
			return nil, fmt.Errorf("property %q: unsupported type %q", p.Key, p.Value.TypeIn)
		}
		if err != nil {
			return nil, fmt.Errorf("property %q: %w", p.Key, err)
		}
		out[p.Key] = v
	}
	return out, nil
}

// mapToKV is the reverse of kvToMap, in key order so output is stable.
func mapToKV(m map[string]any) *kvListXML {
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := &kvListXML{}
	for _, k := range keys {
		var typ, text string
		switch v := m[k].(type) {
		case string:
			typ, text = "string", v
		case bool:
			typ, text = "boolean", strconv.FormatBool(v)
		case int:
			typ, text = "int", strconv.Itoa(v)
		case int32:
			typ, text = "int", strconv.FormatInt(int64(v), 10)
		case int64:
			typ, text = "int", strconv.FormatInt(v, 10)
		case float64:
			typ, text = "double", strconv.FormatFloat(v, 'g', -1, 64)
		case time.Time:
			typ, text = "dateTime", v.UTC().Format(time.RFC3339Nano)
		default:
			typ, text = "string", fmt.Sprint(v)
		}
		out.Items = append(out.Items, kvXML{Key: k, Value: kvValueXML{TypeOut: "d6p1:" + typ, XmlnsD: xsdNamespace, Text: text}})
	}
	return out
}

// clampInt32 converts a count for CountDetails.
func clampInt32(n int) int32 {
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return int32(n)
}

// ptr returns a pointer to a copy of v, for optional XML fields.
func ptr[T any](v T) *T { return &v }
