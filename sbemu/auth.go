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
// sent), and returns its expiry. resource, when non-empty, is what the
// token is presented for; the token's audience must cover it (see
// [audienceCovers]): Service Bus accepts a token whose audience is the
// resource or a prefix of it, so a namespace token (sr=sb://host/, what a
// "SharedAccessSignature=" connection string usually carries) is good for
// every entity of the namespace (learn.microsoft.com/azure/
// service-bus-messaging/service-bus-sas, "Shared Access Signature
// authentication": the token's resource URI may be the namespace or an
// entity, and covers what lies under it). Error messages
// never contain the signature or the key.
func verifySAS(token, keyName, key, resource string, now time.Time) (time.Time, error) {
	rest, ok := strings.CutPrefix(token, sasPrefix)
	if !ok {
		return time.Time{}, errors.New("sbemu: token is not a SharedAccessSignature")
	}
	fields := map[string]string{}
	for _, kv := range strings.Split(rest, "&") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return time.Time{}, errors.New("sbemu: malformed SharedAccessSignature field")
		}
		fields[k] = v
	}
	sr, sig, se, skn := fields["sr"], fields["sig"], fields["se"], fields["skn"]
	if sr == "" || sig == "" || se == "" || skn == "" {
		return time.Time{}, errors.New("sbemu: SharedAccessSignature lacks sr, sig, se or skn")
	}
	if skn != keyName {
		// %q escapes control characters, so a hostile key name cannot forge
		// log lines; the key name is not a secret.
		return time.Time{}, fmt.Errorf("sbemu: unknown key name %q", skn)
	}
	unix, err := strconv.ParseInt(se, 10, 64)
	if err != nil {
		return time.Time{}, errors.New("sbemu: SharedAccessSignature expiry is not a number")
	}
	expiry := time.Unix(unix, 0)
	// now comes from Config.Clock, so tests with a mock clock can expire
	// tokens deterministically.
	if !now.Before(expiry) {
		return time.Time{}, errors.New("sbemu: SharedAccessSignature has expired")
	}
	if resource != "" {
		decoded, err := url.QueryUnescape(sr)
		if err != nil || !audienceCovers(decoded, resource) {
			return time.Time{}, errors.New("sbemu: SharedAccessSignature is for a different audience")
		}
	}
	got, err := url.QueryUnescape(sig)
	if err != nil {
		return time.Time{}, errors.New("sbemu: SharedAccessSignature signature is not URL-encoded")
	}
	// The string to sign uses sr as sent (still URL-escaped), which is what
	// the SDK's token provider signs.
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(sr + "\n" + se))
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	// Constant-time comparison so response timing reveals nothing about the
	// expected signature.
	if !hmac.Equal([]byte(got), []byte(want)) {
		return time.Time{}, errors.New("sbemu: SharedAccessSignature signature does not match the key")
	}
	return expiry, nil
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

// authorize records that the connection holds a token for path, valid
// until expiry, and wakes the watch that detaches links when it lapses
// (token_expiry.go). A later token for the same path replaces it, which is
// how a client renews.
func (c *conn) authorize(path string, expiry time.Time) {
	c.mu.Lock()
	c.authorized[strings.ToLower(path)] = expiry
	c.mu.Unlock()
	select {
	case c.authChanged <- struct{}{}:
	default:
	}
}

// authorizedFor reports whether links to path may attach or stay attached:
// always without StrictAuth, otherwise only while the connection holds an
// unexpired token (on the emulator's clock) for path or one of its parents
// ("orders" covers "orders/$DeadLetterQueue").
func (c *conn) authorizedFor(path string) bool {
	if !c.em.cfg.StrictAuth {
		return true
	}
	now := c.em.cfg.Clock.Now()
	p := strings.ToLower(path)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if expiry, ok := c.authorized[p]; ok && now.Before(expiry) {
			return true
		}
		i := strings.LastIndexByte(p, '/')
		if i < 0 {
			return false
		}
		p = p[:i]
	}
}
