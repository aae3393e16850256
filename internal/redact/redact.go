package redact

import (
	"regexp"
	"strings"
)

// placeholder replaces every secret value.
const placeholder = "REDACTED"

// secretKeys are the keys whose values are secret, matched in any ASCII letter case and only as whole
// words: "SharedAccessKeyName" and "next_token" are not secrets. "SharedAccessSignature" is
// deliberately absent: its value is a token whose only secret part is sig, which has its own entry.
var secretKeys = []string{
	"SharedAccessKey", "AccountKey", "Password", "Pwd", "ClientSecret", "client_secret",
	"access_token", "refresh_token", "id_token", "token", "api_key", "apikey", "sig",
}

// Words that announce a credential without being a key=value pair.
const (
	bearerWord        = "Bearer"
	basicWord         = "Basic"
	authorizationWord = "Authorization"
	jwtPrefix         = "eyJ" // base64 of `{"`, the start of every JWT header
)

// secretPattern matches one recognised secret at the start of its input; [String] tries it only where
// a trigger word begins (see [String] for why that is the same as scanning the whole text). Each
// alternative captures exactly the span to replace in a named group:
//
//   - dq, sq, edq: the inside of a "double", 'single' or \"escaped double\" quoted value;
//   - bare: an unquoted value, from after an optional unmatched quote to the first separator
//     (';', '&', ',', white space or a quote; a backslash escapes anything but a quote);
//   - token: the credentials after a Bearer or Basic scheme; bearer says the scheme stood alone
//     rather than after an Authorization header;
//   - jwt: a whole JSON Web Token.
//
// Values run as far as their character class allows, so that the text right after a match can never
// start another match differently on a second pass: that is what makes [String] idempotent. The word
// boundary before a key or scheme is checked by [String], because an anchored match cannot see the
// character before its input.
var secretPattern = regexp.MustCompile(`^(?:` +
	// key=value, or "key": value
	`(?:\\?["']?)` + foldWords(secretKeys) + `(?:[ \t]*=|\\?["'][ \t]*:)[ \t]*` +
	`(?:"(?P<dq>(?:[^"\\\n]|\\.)*)"` +
	`|'(?P<sq>[^'\n]*)'` +
	`|\\"(?P<edq>(?:[^\\\n]|\\[^"\n])*)\\"` +
	`|["']?(?P<bare>(?:[^;&\s"',\\]|\\[^"'])*))` +
	// Authorization: Bearer x, Authorization: Basic x, Bearer x
	`|(?:` + foldASCII(authorizationWord) + `\\?["']?[ \t]*[:=][ \t]*\\?["']?` + foldWords([]string{bearerWord, basicWord}) +
	`|(?P<bearer>` + foldASCII(bearerWord) + `))[ \t]+(?P<token>[A-Za-z0-9\-._~+/=]+)` +
	// header.payload.signature, allowing empty middle segments (JWE) but not an empty last one, so
	// that a full stop after the token stays outside it.
	`|(?P<jwt>` + jwtPrefix + `[A-Za-z0-9_-]+\.[A-Za-z0-9_.-]*\.[A-Za-z0-9_-]+)` +
	`)`)

// Group numbers of secretPattern, looked up once.
var (
	groupDQ     = secretPattern.SubexpIndex("dq")
	groupSQ     = secretPattern.SubexpIndex("sq")
	groupEDQ    = secretPattern.SubexpIndex("edq")
	groupBare   = secretPattern.SubexpIndex("bare")
	groupBearer = secretPattern.SubexpIndex("bearer")
	groupToken  = secretPattern.SubexpIndex("token")
	groupJWT    = secretPattern.SubexpIndex("jwt")
)

// String returns s with every recognised secret value replaced by REDACTED and everything else
// unchanged. It is safe for concurrent use, and String(String(s)) == String(s).
//
// Every match of secretPattern begins at a trigger word (a key, "Bearer", "Authorization" or "eyJ")
// or at the one or two quote characters just before a key, so String looks for trigger words and
// tries the anchored pattern only there, leftmost first, resuming after each match: the result is
// the one an unanchored search would give, at a fraction of the cost, and text without a trigger word
// never reaches the regular expression at all.
func String(s string) string {
	var out strings.Builder // stays empty until the first secret
	copied := 0             // s[:copied] is in out, or was replaced
	for i := 0; i < len(s); i++ {
		if !triggerAt(s, i) {
			continue
		}
		for c := max(i-2, 0); c <= i; c++ {
			if c < i && !strings.ContainsRune(`"'\`, rune(s[c])) {
				continue // only a quote or an escaped quote may precede a key
			}
			if c == i && c > 0 && isWordByte(s[c-1]) {
				continue // a trigger inside a longer word, like next_token or surveyJS
			}
			m := secretPattern.FindStringSubmatchIndex(s[c:])
			if m == nil {
				continue
			}
			if start, end, ok := secretSpan(s[c:], m); ok {
				out.Grow(len(s))
				out.WriteString(s[copied : c+start])
				out.WriteString(placeholder)
				copied = c + end
			}
			i = c + m[1] - 1 // resume after the match, secret or not; every match is non-empty
			break
		}
	}
	if copied == 0 {
		return s // nothing to hide: keep the original, unallocated
	}
	out.WriteString(s[copied:])
	return out.String()
}

// secretSpan returns the part of match m of s that is the secret, or false if there is none. A match
// can hold no secret when its value is empty ("Password=;"), is only trailing punctuation, or is the
// plain word of a sentence ("the bearer token expired").
func secretSpan(s string, m []int) (start, end int, ok bool) {
	group := func(i int) (int, int, bool) { return m[2*i], m[2*i+1], m[2*i] >= 0 }
	for _, whole := range []int{groupDQ, groupSQ, groupEDQ, groupJWT} { // replaced exactly as captured
		if start, end, ok := group(whole); ok {
			return start, end, start < end
		}
	}
	if start, end, ok := group(groupBare); ok {
		end = start + len(trimTrailing(s[start:end]))
		return start, end, start < end
	}
	if start, end, ok := group(groupToken); ok {
		end = start + len(trimTrailing(s[start:end]))
		if _, _, alone := group(groupBearer); alone && isShortWord(s[start:end]) {
			return 0, 0, false
		}
		return start, end, start < end
	}
	return 0, 0, false
}

// trimTrailing drops the characters that, at the end of an unquoted value, almost always belong to
// the sentence around it: a full stop or colon ("SharedAccessKey=abc: refused"), a closing bracket
// ("(token=abc)"), or an escaped line break left by %q ("Password=abc\n"). None of them occurs at the
// end of a base64 or hex secret; a password that ends in one shows that one character.
func trimTrailing(v string) string {
	for v != "" {
		switch {
		case strings.ContainsRune(".:)]}>", rune(v[len(v)-1])):
			v = v[:len(v)-1]
		case len(v) >= 2 && v[len(v)-2] == '\\' && strings.ContainsRune("nrt", rune(v[len(v)-1])):
			v = v[:len(v)-2]
		default:
			return v
		}
	}
	return v
}

// isShortWord reports whether v looks like an English word rather than a credential: letters only
// and shorter than any real token. "Bearer" is an ordinary word in messages such as "failed to get a
// bearer token", while bearer credentials are long and almost always contain digits or symbols.
func isShortWord(v string) bool {
	const longestWord = 15
	if v == "" || len(v) > longestWord {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// triggers are the words without which secretPattern cannot match, lower-cased and grouped by their
// first letter so that [String] can test a position cheaply. The pattern only folds ASCII letters
// (see [foldASCII]), so an ASCII case-insensitive comparison here finds everything it could match.
var triggers = func() (byFirst [26][]string) {
	for _, w := range append(append([]string(nil), secretKeys...), bearerWord, authorizationWord) {
		w = strings.ToLower(w)
		byFirst[w[0]-'a'] = append(byFirst[w[0]-'a'], w)
	}
	return byFirst
}()

// triggerAt reports whether a trigger word or the start of a JWT begins at s[i], without allocating.
func triggerAt(s string, i int) bool {
	if strings.HasPrefix(s[i:], jwtPrefix) {
		return true
	}
	c := s[i] | 0x20 // ASCII lower case; no other byte becomes a letter
	if c < 'a' || c > 'z' {
		return false
	}
	for _, w := range triggers[c-'a'] {
		if len(s)-i >= len(w) && equalFoldASCII(s[i:i+len(w)], w) {
			return true
		}
	}
	return false
}

// isWordByte reports whether c is an ASCII word character, as regexp's \b sees it.
func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c|0x20 && c|0x20 <= 'z'
}

// equalFoldASCII reports whether s equals the lower-case ASCII word w, ignoring ASCII case only.
func equalFoldASCII(s, w string) bool {
	for i := 0; i < len(w); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != w[i] {
			return false
		}
	}
	return true
}

// foldWords returns a non-capturing group matching any of words, each in any ASCII letter case.
func foldWords(words []string) string {
	parts := make([]string, len(words))
	for i, w := range words {
		parts[i] = foldASCII(w)
	}
	return "(?:" + strings.Join(parts, "|") + ")"
}

// foldASCII returns a pattern matching word in any ASCII letter case. It stands in for (?i), which also
// folds Unicode look-alikes (the Kelvin sign matches k) that [triggerAt] would not find.
func foldASCII(word string) string {
	var b strings.Builder
	for i := 0; i < len(word); i++ {
		c := word[i]
		if lower := c | 0x20; 'a' <= lower && lower <= 'z' {
			b.WriteString("[" + string(lower-('a'-'A')) + string(lower) + "]")
			continue
		}
		b.WriteString(regexp.QuoteMeta(string(c)))
	}
	return b.String()
}
