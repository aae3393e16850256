package console

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"unicode"
)

// Role is what the holder of a [Token] may do.
type Role int

const (
	// RoleReader may read every page and nothing more: a console opened with a reader token shows no
	// action buttons, and refuses every action (its preview included) with 403 Forbidden.
	RoleReader Role = iota + 1
	// RoleOperator may read and act: redrive, purge, cancel and release, each previewed and confirmed.
	RoleOperator
)

// String names the role as the pages and the audit log show it: "reader" or "operator".
func (r Role) String() string {
	switch r {
	case RoleReader:
		return "reader"
	case RoleOperator:
		return "operator"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// MinTokenSecret is the shortest Secret a [Token] may have, in bytes: a secret that guards who may
// purge customer messages should not be guessable, and 16 random characters are not.
const MinTokenSecret = 16

// Token is one access token of the console: who holds it, the secret they present, and what they may
// do. Give each person or team its own, so that the audit log says who acted.
type Token struct {
	// Name says who holds the token: the audit log records it for every action, and the pages show
	// it. It is not secret. Required: 1 to 64 printable characters, unique among the tokens (ignoring
	// case).
	Name string
	// Secret is what a request presents (an Authorization: Bearer header, or ?token= once, which sets
	// a cookie). Required: at least [MinTokenSecret] bytes, unique among the tokens. It is compared in
	// constant time and never logged, shown or put in an error.
	Secret string
	// Role is what the token may do: [RoleReader] or [RoleOperator]. Required.
	Role Role
}

// accessTokenName is the name the audit log gives the holder of [Options.AccessToken].
const accessTokenName = "access-token"

// validateTokens checks the tokens of o, naming a wrong one by its position and name, never by its
// secret. It returns the tokens the console checks: Tokens, or AccessToken as one operator token.
func validateTokens(o Options) ([]Token, error) {
	if o.AccessToken != "" && len(o.Tokens) > 0 {
		return nil, fmt.Errorf("%w: AccessToken and Tokens are both set: give the access token its name and role in Tokens", ErrInvalidOptions)
	}
	if o.AccessToken != "" {
		return []Token{{Name: accessTokenName, Secret: o.AccessToken, Role: RoleOperator}}, nil
	}
	names := map[string]bool{}
	secrets := map[[32]byte]bool{}
	for i, t := range o.Tokens {
		switch {
		case t.Name == "" || len([]rune(t.Name)) > 64 || strings.IndexFunc(t.Name, notPrintable) >= 0:
			return nil, fmt.Errorf("%w: Tokens[%d]: Name must be 1 to 64 printable characters", ErrInvalidOptions, i)
		case names[strings.ToLower(t.Name)]:
			return nil, fmt.Errorf("%w: Tokens[%d]: the name %q is given twice", ErrInvalidOptions, i, t.Name)
		case len(t.Secret) < MinTokenSecret:
			return nil, fmt.Errorf("%w: Tokens[%d] (%s): the secret is shorter than %d bytes", ErrInvalidOptions, i, t.Name, MinTokenSecret)
		case t.Role != RoleReader && t.Role != RoleOperator:
			return nil, fmt.Errorf("%w: Tokens[%d] (%s): Role %v is neither RoleReader nor RoleOperator", ErrInvalidOptions, i, t.Name, t.Role)
		}
		h := sha256.Sum256([]byte(t.Secret))
		if secrets[h] {
			return nil, fmt.Errorf("%w: Tokens[%d] (%s): its secret is another token's too: the audit log could not tell them apart", ErrInvalidOptions, i, t.Name)
		}
		names[strings.ToLower(t.Name)], secrets[h] = true, true
	}
	return o.Tokens, nil
}

// notPrintable reports a character a token's name may not hold (it is shown and logged).
func notPrintable(r rune) bool { return !unicode.IsPrint(r) }

// principal is who a request comes from: the name and role of the token it presented. A console
// without tokens serves everyone who reaches it (loopback, or Options.AllowedHosts) as an operator
// without a name, as it always did.
type principal struct {
	Name string
	Role Role
}

// canAct reports whether p may run actions.
func (p principal) canAct() bool { return p.Role == RoleOperator }

// who names p for the audit log and the pages: the token's name, or "(no token)".
func (p principal) who() string {
	if p.Name == "" {
		return "(no token)"
	}
	return p.Name
}

type principalKey struct{}

// withPrincipal returns r with p in its context.
func withPrincipal(r *http.Request, p principal) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
}

// principalOf returns who r comes from; a request that passed no token check (a console without
// tokens) is an unnamed operator.
func principalOf(r *http.Request) principal {
	if p, ok := r.Context().Value(principalKey{}).(principal); ok {
		return p
	}
	return principal{Role: RoleOperator}
}

// tokenSet matches a presented secret against the tokens in constant time: every token is compared,
// whichever matches, and each comparison is of two SHA-256 sums, so neither the time nor anything
// else tells how much of a guess was right, how long a secret is or which token was close.
type tokenSet struct {
	sums   [][32]byte
	tokens []principal
}

func newTokenSet(tokens []Token) *tokenSet {
	s := &tokenSet{}
	for _, t := range tokens {
		s.sums = append(s.sums, sha256.Sum256([]byte(t.Secret)))
		s.tokens = append(s.tokens, principal{Name: t.Name, Role: t.Role})
	}
	return s
}

// match returns the principal of the token whose secret is got.
func (s *tokenSet) match(got string) (principal, bool) {
	if got == "" {
		return principal{}, false
	}
	g := sha256.Sum256([]byte(got))
	found := -1
	for i := range s.sums {
		eq := subtle.ConstantTimeCompare(s.sums[i][:], g[:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	if found < 0 {
		return principal{}, false
	}
	return s.tokens[found], true
}
