package console

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
)

// Patterns replaced before an error is hashed, most specific first, so that the parts of a message that
// differ between occurrences of one failure (ids, numbers, addresses) do not split its group.
var (
	uuidPattern   = regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)
	hexPattern    = regexp.MustCompile(`(?i)\b0x[0-9a-f]+\b|\b[0-9a-f]*[0-9][0-9a-f]*[a-f][0-9a-f]*\b|\b[0-9a-f]*[a-f][0-9a-f]*[0-9][0-9a-f]*\b`)
	digitsPattern = regexp.MustCompile(`[0-9]+`)
	spacePattern  = regexp.MustCompile(`\s+`)
)

// NormalizeError is the error text a fingerprint hashes: UUIDs become <id>, hexadecimal values (0x…,
// or runs mixing digits and the letters a-f, such as hashes and trace ids) become <hex>, other digit
// runs become <n>, and white space is collapsed.
func NormalizeError(s string) string {
	s = uuidPattern.ReplaceAllString(s, "<id>")
	s = hexPattern.ReplaceAllStringFunc(s, func(m string) string {
		if len(m) < 6 && !strings.HasPrefix(strings.ToLower(m), "0x") {
			return m // a short word such as "db2" or "e4" is text, its digits are handled below
		}
		return "<hex>"
	})
	s = digitsPattern.ReplaceAllString(s, "<n>")
	return strings.TrimSpace(spacePattern.ReplaceAllString(s, " "))
}

// Fingerprint identifies a failure: the hash of the dead-letter reason and the normalized error
// ([NormalizeError]), as 12 hexadecimal digits. Dead letters with the same fingerprint form one group.
func Fingerprint(reason, errText string) string {
	// 48 bits keep URLs short; a collision between two failure patterns of one entity would merge two
	// groups on a page, and every action still lists and checks exact refs.
	sum := sha256.Sum256([]byte(reason + "\x00" + NormalizeError(errText)))
	return hex.EncodeToString(sum[:6])
}
