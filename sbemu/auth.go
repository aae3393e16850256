package sbemu

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// sasPrefix starts every shared access signature token.
const sasPrefix = "SharedAccessSignature "

// verifySAS checks a Service Bus shared access signature,
//
//	SharedAccessSignature sr=<url-escaped audience>&sig=<url-escaped base64 HMAC>&se=<unix expiry>&skn=<key name>
//
// where the HMAC-SHA256 with key is taken over "<sr>\n<se>" (sr exactly as
// sent), against the single key keyName, and returns its expiry; see
// [checkSAS], which the emulator uses with its policies.
func verifySAS(token, keyName, key, resource string, now time.Time) (time.Time, error) {
	expiry, _, err := checkSAS(token, resource, now, func(name string) (policy, bool) {
		return policy{keys: []string{key}, rights: allRights}, name == keyName
	})
	return expiry, err
}

// checkSAS checks a shared access signature (see [verifySAS] for its form)
// and returns its expiry and the rights of the policy that signed it.
// lookup finds the policy the token's key name (skn) names; a token
// signed with any of its keys is good. resource, when non-empty, is what
// the token is presented for; the token's audience must cover it (see
// [audienceCovers]): Service Bus accepts a token whose audience is the
// resource or a prefix of it, so a namespace token (sr=sb://host/, what a
// "SharedAccessSignature=" connection string usually carries) is good for
// every entity of the namespace (learn.microsoft.com/azure/
// service-bus-messaging/service-bus-sas, "Shared Access Signature
// authentication": the token's resource URI may be the namespace or an
// entity, and covers what lies under it). An expired token is described
// as Service Bus describes it ([expiredToken]). Error messages never
// contain the signature or the key.
func checkSAS(token, resource string, now time.Time, lookup func(keyName string) (policy, bool)) (time.Time, rights, error) {
	rest, ok := strings.CutPrefix(token, sasPrefix)
	if !ok {
		return time.Time{}, 0, errors.New("sbemu: token is not a SharedAccessSignature")
	}
	fields := map[string]string{}
	for _, kv := range strings.Split(rest, "&") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return time.Time{}, 0, errors.New("sbemu: malformed SharedAccessSignature field")
		}
		fields[k] = v
	}
	sr, sig, se, skn := fields["sr"], fields["sig"], fields["se"], fields["skn"]
	if sr == "" || sig == "" || se == "" || skn == "" {
		return time.Time{}, 0, errors.New("sbemu: SharedAccessSignature lacks sr, sig, se or skn")
	}
	p, ok := lookup(skn)
	if !ok {
		// %q escapes control characters, so a hostile key name cannot forge
		// log lines; the key name is not a secret.
		return time.Time{}, 0, fmt.Errorf("sbemu: unknown key name %q", skn)
	}
	unix, err := strconv.ParseInt(se, 10, 64)
	if err != nil {
		return time.Time{}, 0, errors.New("sbemu: SharedAccessSignature expiry is not a number")
	}
	expiry := time.Unix(unix, 0)
	// now comes from Config.Clock, so tests with a mock clock can expire
	// tokens deterministically.
	if !now.Before(expiry) {
		return time.Time{}, 0, fmt.Errorf("%s. sbemu: the SharedAccessSignature has expired", expiredToken(expiry))
	}
	if resource != "" {
		decoded, err := url.QueryUnescape(sr)
		if err != nil || !audienceCovers(decoded, resource) {
			return time.Time{}, 0, errors.New("sbemu: SharedAccessSignature is for a different audience")
		}
	}
	got, err := url.QueryUnescape(sig)
	if err != nil {
		return time.Time{}, 0, errors.New("sbemu: SharedAccessSignature signature is not URL-encoded")
	}
	for _, key := range p.keys {
		// The string to sign uses sr as sent (still URL-escaped), which is
		// what the SDK's token provider signs.
		mac := hmac.New(sha256.New, []byte(key))
		mac.Write([]byte(sr + "\n" + se))
		want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
		// Constant-time comparison so response timing reveals nothing about
		// the expected signature.
		if hmac.Equal([]byte(got), []byte(want)) {
			return expiry, p.rights, nil
		}
	}
	return time.Time{}, 0, errors.New("sbemu: SharedAccessSignature signature does not match the key")
}

// audienceCovers reports whether a token audience is the resource or one of
// its parents, segment by segment ("sb://ns/orders" covers
// "amqp://ns/orders/$management" but not "amqp://ns/orders2"), ignoring
// case (Service Bus entity names are case-insensitive), scheme (a token
// for sb://ns/ is presented for amqp:// and https:// addresses; the
// SDK's own SAS helper signs the bare host), query and trailing slashes.
func audienceCovers(audience, resource string) bool {
	norm := func(s string) string {
		s = strings.ToLower(s)
		if i := strings.Index(s, "://"); i >= 0 {
			s = s[i+3:]
		}
		s, _, _ = strings.Cut(s, "?")
		return strings.TrimRight(s, "/")
	}
	aud, res := norm(audience), norm(resource)
	return aud != "" && (res == aud || strings.HasPrefix(res, aud+"/"))
}

// grant is what one token gives a connection for a path: rights until
// expiry.
type grant struct {
	expiry time.Time
	rights rights
}

// authorize records that the connection holds a token for path with
// rights, valid until expiry, and wakes the watch that detaches links when
// it lapses (token_expiry.go). A later token for the same path replaces
// it, which is how a client renews.
func (c *conn) authorize(path string, expiry time.Time, r rights) {
	c.mu.Lock()
	c.authorized[strings.ToLower(path)] = grant{expiry: expiry, rights: r}
	c.mu.Unlock()
	select {
	case c.authChanged <- struct{}{}:
	default:
	}
}

// rightsFor returns the rights the connection holds for path: every right
// without StrictAuth; otherwise those of the unexpired tokens (on the
// emulator's clock) for path, one of its parents ("orders" covers
// "orders/$DeadLetterQueue") or the namespace. ok is false when no such
// token is held, so links to path may not attach or stay attached.
func (c *conn) rightsFor(path string) (r rights, ok bool) {
	if !c.em.cfg.StrictAuth {
		return allRights, true
	}
	now := c.em.cfg.Clock.Now()
	p := strings.ToLower(strings.Trim(path, "/"))
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if g, held := c.authorized[p]; held && now.Before(g.expiry) {
			r, ok = r|g.rights, true
		}
		if p == "" {
			return r, ok
		}
		if i := strings.LastIndexByte(p, '/'); i >= 0 {
			p = p[:i]
		} else {
			p = ""
		}
	}
}
