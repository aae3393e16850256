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
// sent). audience, when non-empty, must match sr. Error messages never
// contain the signature or the key.
func verifySAS(token, keyName, key, audience string, now time.Time) error {
	rest, ok := strings.CutPrefix(token, sasPrefix)
	if !ok {
		return errors.New("sbemu: token is not a SharedAccessSignature")
	}
	fields := map[string]string{}
	for _, kv := range strings.Split(rest, "&") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return errors.New("sbemu: malformed SharedAccessSignature field")
		}
		fields[k] = v
	}
	sr, sig, se, skn := fields["sr"], fields["sig"], fields["se"], fields["skn"]
	if sr == "" || sig == "" || se == "" || skn == "" {
		return errors.New("sbemu: SharedAccessSignature lacks sr, sig, se or skn")
	}
	if skn != keyName {
		return fmt.Errorf("sbemu: unknown key name %q", skn)
	}
	expiry, err := strconv.ParseInt(se, 10, 64)
	if err != nil {
		return errors.New("sbemu: SharedAccessSignature expiry is not a number")
	}
	// now comes from Config.Clock, so tests with a mock clock can expire
	// tokens deterministically.
	if !now.Before(time.Unix(expiry, 0)) {
		return errors.New("sbemu: SharedAccessSignature has expired")
	}
	if audience != "" {
		decoded, err := url.QueryUnescape(sr)
		if err != nil || !strings.EqualFold(strings.TrimSuffix(decoded, "/"), strings.TrimSuffix(audience, "/")) {
			return errors.New("sbemu: SharedAccessSignature is for a different audience")
		}
	}
	got, err := url.QueryUnescape(sig)
	if err != nil {
		return errors.New("sbemu: SharedAccessSignature signature is not URL-encoded")
	}
	// The string to sign uses sr as sent (still URL-escaped), which is what
	// the SDK's token provider signs.
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(sr + "\n" + se))
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	// Constant-time comparison so response timing reveals nothing about the
	// expected signature.
	if !hmac.Equal([]byte(got), []byte(want)) {
		return errors.New("sbemu: SharedAccessSignature signature does not match the key")
	}
	return nil
}

// authorize records that the connection holds a valid token for path.
func (c *conn) authorize(path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.authorized[strings.ToLower(path)] = true
}

// authorizedFor reports whether links to path may attach: always without
// StrictAuth, otherwise only after an accepted put-token for path or one of
// its parents ("orders" covers "orders/$DeadLetterQueue").
func (c *conn) authorizedFor(path string) bool {
	if !c.em.cfg.StrictAuth {
		return true
	}
	p := strings.ToLower(path)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.authorized[p] {
			return true
		}
		i := strings.LastIndexByte(p, '/')
		if i < 0 {
			return false
		}
		p = p[:i]
	}
}
