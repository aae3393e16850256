package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sbretry/retry/sbemu"
)

// authRules collects repeated -auth-rule flags, each a namespace shared
// access policy ([sbemu.AuthorizationRule]) written as
//
//	NAME=KEY:RIGHT[,RIGHT...]
//
// for example listen-only=c2VjcmV0:Listen. The key runs from the first "="
// to the last ":" (base64 keys contain "=" but never ":"); rights are
// Manage, Send and Listen, ignoring case. They are checked under
// -strict-auth, where a connection string naming NAME and KEY has exactly
// those rights. Set refuses an empty name or key, a missing or unknown
// right, and a name given twice, so a typo is a usage error (exit status
// 2), not a policy that silently grants nothing.
type authRules []sbemu.AuthorizationRule

// String implements [flag.Value]; it names the rules, never their keys.
func (a *authRules) String() string {
	if a == nil {
		return ""
	}
	names := make([]string, len(*a))
	for i, r := range *a {
		names[i] = r.KeyName
	}
	return strings.Join(names, ",")
}

// Set implements [flag.Value], adding one rule.
func (a *authRules) Set(v string) error {
	rule, err := parseAuthRule(v)
	if err != nil {
		return err
	}
	for _, r := range *a {
		if strings.EqualFold(r.KeyName, rule.KeyName) {
			return fmt.Errorf("key name %q given twice", rule.KeyName)
		}
	}
	*a = append(*a, rule)
	return nil
}

// parseAuthRule reads NAME=KEY:RIGHT[,RIGHT...]. Errors never quote the
// key.
func parseAuthRule(v string) (sbemu.AuthorizationRule, error) {
	const want = "want NAME=KEY:RIGHTS, e.g. listen-only=KEY:Listen"
	name, rest, ok := strings.Cut(v, "=")
	if !ok {
		return sbemu.AuthorizationRule{}, errors.New("no \"=\": " + want)
	}
	name = strings.TrimSpace(name)
	if name == "" {
		return sbemu.AuthorizationRule{}, errors.New("empty key name: " + want)
	}
	i := strings.LastIndex(rest, ":")
	if i < 0 {
		return sbemu.AuthorizationRule{}, fmt.Errorf("rule %q has no rights: %s", name, want)
	}
	key, list := rest[:i], rest[i+1:]
	if key == "" {
		return sbemu.AuthorizationRule{}, fmt.Errorf("rule %q has an empty key: %s", name, want)
	}
	rule := sbemu.AuthorizationRule{KeyName: name, PrimaryKey: key}
	for _, s := range strings.Split(list, ",") {
		right, err := parseRight(strings.TrimSpace(s))
		if err != nil {
			return sbemu.AuthorizationRule{}, fmt.Errorf("rule %q: %w", name, err)
		}
		rule.Rights = append(rule.Rights, right)
	}
	return rule, nil
}

// parseRight reads one right, ignoring case.
func parseRight(s string) (sbemu.AccessRight, error) {
	for _, r := range []sbemu.AccessRight{sbemu.RightManage, sbemu.RightSend, sbemu.RightListen} {
		if strings.EqualFold(s, string(r)) {
			return r, nil
		}
	}
	if s == "" {
		return "", errors.New("empty right: want Manage, Send or Listen")
	}
	return "", fmt.Errorf("unknown access right %q: want Manage, Send or Listen", s)
}
