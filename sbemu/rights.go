package sbemu

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"time"
)

// Access rights of shared access policies, under [Config.StrictAuth].
//
// A Service Bus namespace has shared access policies (authorization
// rules), each a key name, a primary and a secondary key and a set of
// rights: Send, Listen and Manage; queues and topics can have policies of
// their own (learn.microsoft.com/azure/service-bus-messaging/
// service-bus-sas, "Shared access authorization policies"). A token signed
// with a policy's key carries its rights, and the service refuses what
// they do not cover:
//
//   - a sender link without Send, a receiver link without Listen, with
//     amqp:unauthorized-access "Unauthorized access. 'Send' claim(s) are
//     required to perform this operation." (the SDK's live tests
//     TestClientUnauthorizedCreds and TestReceiverUnauthorizedCreds look
//     for that text, which the SDK reports as CodeUnauthorizedAccess);
//   - management operations the same way, by what they do: scheduling
//     needs Send, everything else (peek, renewals, settlement by lock
//     token, sessions) Listen;
//   - the administration API without Manage, 401 (admin_auth.go).
//
// Manage implies Send and Listen: Service Bus only accepts a policy with
// Manage that also has both. The emulator's own key ([Config.KeyName],
// [Config.Key]) is the namespace's root policy, with every right, as
// RootManageSharedAccessKey is on a new namespace. Without StrictAuth no
// token is checked and every connection has every right.

// AccessRight is one right of a shared access policy.
type AccessRight string

// The rights, spelt as the administration API spells them (azservicebus
// admin.AccessRight).
const (
	RightManage AccessRight = "Manage"
	RightSend   AccessRight = "Send"
	RightListen AccessRight = "Listen"
)

// AuthorizationRule is a namespace-wide shared access policy: a token
// signed with either key, naming KeyName, has Rights on every entity.
type AuthorizationRule struct {
	// KeyName names the policy in tokens (their skn). Required; unique
	// ignoring case, and other than [Config.KeyName].
	KeyName string
	// PrimaryKey and SecondaryKey sign tokens; either is accepted. The
	// primary key is required; an empty secondary key accepts nothing.
	PrimaryKey, SecondaryKey string
	// Rights are what the policy's tokens may do; at least one.
	Rights []AccessRight
}

// rights is a set of access rights.
type rights uint8

const (
	rightSend rights = 1 << iota
	rightListen
	rightManage

	allRights = rightSend | rightListen | rightManage
)

// has reports whether r includes every right of need.
func (r rights) has(need rights) bool { return r&need == need }

// String names the rights as a claim list ("Send", "Manage,Send,Listen").
func (r rights) String() string {
	var names []string
	for _, x := range []struct {
		bit  rights
		name AccessRight
	}{{rightManage, RightManage}, {rightSend, RightSend}, {rightListen, RightListen}} {
		if r&x.bit != 0 {
			names = append(names, string(x.name))
		}
	}
	return strings.Join(names, ",")
}

// parseRights reads a policy's rights, ignoring case; Manage brings Send
// and Listen with it.
func parseRights(list []string) (rights, error) {
	var r rights
	for _, s := range list {
		switch {
		case strings.EqualFold(s, string(RightManage)):
			r |= allRights
		case strings.EqualFold(s, string(RightSend)):
			r |= rightSend
		case strings.EqualFold(s, string(RightListen)):
			r |= rightListen
		default:
			return 0, fmt.Errorf("unknown access right %q: want Manage, Send or Listen", s)
		}
	}
	if r == 0 {
		return 0, fmt.Errorf("no access rights: want Manage, Send or Listen")
	}
	return r, nil
}

// policy is a shared access policy ready for checking tokens.
type policy struct {
	keys   []string // non-empty keys, primary first
	rights rights
}

// namespacePolicies builds the namespace's policies from cfg (defaults
// applied), keyed by lower-case key name, or says what is wrong with
// AuthorizationRules.
func namespacePolicies(cfg Config) (map[string]policy, error) {
	out := map[string]policy{strings.ToLower(cfg.KeyName): {keys: []string{cfg.Key}, rights: allRights}}
	for i, rule := range cfg.AuthorizationRules {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("sbemu: AuthorizationRules[%d] %q: %s", i, rule.KeyName, fmt.Sprintf(format, args...))
		}
		key := strings.ToLower(rule.KeyName)
		switch _, dup := out[key]; {
		case strings.TrimSpace(rule.KeyName) == "":
			return nil, bad("empty KeyName")
		case dup:
			return nil, bad("the key name is taken (by KeyName or another rule)")
		case rule.PrimaryKey == "":
			return nil, bad("empty PrimaryKey")
		}
		names := make([]string, len(rule.Rights))
		for j, r := range rule.Rights {
			names[j] = string(r)
		}
		r, err := parseRights(names)
		if err != nil {
			return nil, bad("%v", err)
		}
		p := policy{keys: []string{rule.PrimaryKey}, rights: r}
		if rule.SecondaryKey != "" {
			p.keys = append(p.keys, rule.SecondaryKey)
		}
		out[key] = p
	}
	return out, nil
}

// policyFor finds the policy a token names for the entity at path: a
// namespace policy, else one of the entity's own (kept by the
// administration API, admin_authrules.go) or of an entity above it (a
// topic's policies cover its subscriptions).
func (e *Emulator) policyFor(keyName, path string) (policy, bool) {
	if p, ok := e.policies[strings.ToLower(keyName)]; ok {
		return p, true
	}
	if e.admin == nil {
		return policy{}, false
	}
	return e.admin.entityPolicy(keyName, path)
}

// missingClaim describes a refusal for a right the token lacks in Service
// Bus's words ("Unauthorized access. 'Send' claim(s) are required to
// perform this operation.", which the SDK's live tests check), naming the
// entity.
func missingClaim(need rights, entity string) string {
	return fmt.Sprintf("Unauthorized access. '%s' claim(s) are required to perform this operation. Resource: '%s'.", need, entity)
}

// expiredToken describes a refusal for an expired token as Service Bus
// does ("ExpiredToken: The token is expired. Expiration time: …", which
// the SDK's live tests check after "status code 401 and description: ").
func expiredToken(expiry time.Time) string {
	return fmt.Sprintf("ExpiredToken: The token is expired. Expiration time: '%s'", expiry.UTC().Format(time.RFC3339))
}

// newPolicyKey makes a key for a policy created without one, as Service
// Bus generates the keys a request leaves out: 32 random bytes in base64.
func newPolicyKey() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return base64.StdEncoding.EncodeToString(b[:])
}
