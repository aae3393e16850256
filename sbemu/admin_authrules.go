package sbemu

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Authorization rules of queues and topics in the administration API.
//
// Service Bus lets a queue or topic carry shared access policies of its
// own (learn.microsoft.com/azure/service-bus-messaging/service-bus-sas,
// "Shared access authorization policies"): the description's
// AuthorizationRules, each a SharedAccessAuthorizationRule with a key
// name, a primary and a secondary key and its rights (azservicebus v1.11.0
// internal/atom/models.go, AuthorizationRule, which the SDK writes with
// ClaimType "SharedAccessKey" and ClaimValue "None"). The emulator keeps
// them with the entity's other echoed settings (admin_echoed.go), reports
// them back as they were given, without created or modified times (the
// SDK's live tests TestAdminClient_UpdateQueue, TestAdminClient_UpdateTopic
// and TestAdminClient_QueueWithMaxValues compare the rules they read with
// the ones they wrote, times unset), generates the keys a request leaves
// out, as the service does, and, under [Config.StrictAuth], accepts tokens
// signed with a rule's key for the entity and what lies under it (a
// topic's rules cover its subscriptions), with the rule's rights
// (rights.go).

// sharedAccessRuleType is the i:type of a shared access rule.
const sharedAccessRuleType = "SharedAccessAuthorizationRule"

// authorizationRuleXML is one AuthorizationRule element. TypeIn reads the
// i:type attribute by namespace; TypeOut writes it with the "i" prefix
// declared on the description.
type authorizationRuleXML struct {
	TypeIn       string   `xml:"http://www.w3.org/2001/XMLSchema-instance type,attr,omitempty"`
	TypeOut      string   `xml:"i:type,attr,omitempty"`
	ClaimType    string   `xml:"ClaimType"`
	ClaimValue   string   `xml:"ClaimValue"`
	Rights       []string `xml:"Rights>AccessRights"`
	KeyName      *string  `xml:"KeyName"`
	PrimaryKey   *string  `xml:"PrimaryKey"`
	SecondaryKey *string  `xml:"SecondaryKey"`
}

// normalizeAuthorizationRules checks the rules of a PUT and returns them as
// the emulator keeps and reports them: known type, a key name unique
// ignoring case, rights spelt as the API spells them, both keys present.
// kind names the entity kind for errors.
func normalizeAuthorizationRules(kind string, in []authorizationRuleXML) ([]authorizationRuleXML, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]authorizationRuleXML, 0, len(in))
	seen := map[string]bool{}
	for i, r := range in {
		bad := func(format string, args ...any) error {
			return apiErrorf(http.StatusBadRequest, "sbemu: %s: AuthorizationRules[%d]: %s", kind, i, fmt.Sprintf(format, args...))
		}
		if r.TypeIn != "" && !strings.EqualFold(localName(r.TypeIn), sharedAccessRuleType) {
			return nil, bad("type %q: only %s is supported", r.TypeIn, sharedAccessRuleType)
		}
		if r.KeyName == nil || strings.TrimSpace(*r.KeyName) == "" {
			return nil, bad("no KeyName")
		}
		name := *r.KeyName
		if seen[strings.ToLower(name)] {
			return nil, bad("KeyName %q appears twice", name)
		}
		seen[strings.ToLower(name)] = true
		if _, err := parseRights(r.Rights); err != nil {
			return nil, bad("KeyName %q: %v", name, err)
		}
		norm := authorizationRuleXML{
			TypeOut: sharedAccessRuleType, ClaimType: "SharedAccessKey", ClaimValue: "None",
			Rights: canonicalRights(r.Rights), KeyName: ptr(name),
			PrimaryKey: keyOrNew(r.PrimaryKey), SecondaryKey: keyOrNew(r.SecondaryKey),
		}
		out = append(out, norm)
	}
	return out, nil
}

// canonicalRights spells each right as the API does, in the order given,
// once; the rights are known to parse.
func canonicalRights(given []string) []string {
	out := make([]string, 0, len(given))
	for _, g := range given {
		for _, right := range []AccessRight{RightManage, RightSend, RightListen} {
			if strings.EqualFold(g, string(right)) && !slices.Contains(out, string(right)) {
				out = append(out, string(right))
			}
		}
	}
	return out
}

// localName is the part of a qualified XML name after its prefix.
func localName(s string) string {
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// keyOrNew is the key given, or a new one when it is missing.
func keyOrNew(k *string) *string {
	if k == nil || *k == "" {
		return ptr(newPolicyKey())
	}
	return ptr(*k)
}

// entityPolicy finds a policy named keyName among the authorization rules
// of the entity at path or of an entity above it ("orders/$management"
// looks at "orders", "events/Subscriptions/audit" at the subscription and
// then at "events").
func (a *adminServer) entityPolicy(keyName, path string) (policy, bool) {
	p := strings.ToLower(strings.Trim(path, "/"))
	a.mu.Lock()
	defer a.mu.Unlock()
	for p != "" {
		if m, ok := a.meta[p]; ok {
			for _, r := range m.authRules {
				if r.KeyName == nil || !strings.EqualFold(*r.KeyName, keyName) {
					continue
				}
				granted, err := parseRights(r.Rights)
				if err != nil {
					return policy{}, false // unreachable: checked when stored
				}
				return policy{keys: []string{*r.PrimaryKey, *r.SecondaryKey}, rights: granted}, true
			}
		}
		i := strings.LastIndexByte(p, '/')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return policy{}, false
}
