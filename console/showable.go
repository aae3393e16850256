package console

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sbretry/retry/internal/redact"
)

// Text a message carries (ids, reasons, errors, property names and values, session ids) is the
// producer's, and a producer may be hostile or broken. html/template keeps it from becoming markup;
// showable also keeps it from lying to the operator: a terminal escape, a NUL, a right-to-left override
// that shows "exe.png" as "gnp.exe", or a zero-width space that makes two ids look alike are shown as
// escapes (\x1b, \u202e), and a value of megabytes is clipped.

// maxShown is the most characters of one value a page shows; the rest is summarised by its size.
// maxShownBlock is the same for a block of text (a last error, a body).
const (
	maxShown      = 2000
	maxShownBlock = 64 << 10
)

// showable is s with every control character (line breaks and tabs included), every format character
// (bidi controls, zero-width characters) and every invalid UTF-8 byte written as a Go escape, clipped
// to maxShown characters. Ordinary text of any script is kept as it is.
func showable(s string) string { return escapeText(s, false, maxShown) }

// showableBlock is showable for a block of text (a last error, a body) shown in a <pre>: line breaks
// and tabs are kept, and it is clipped at maxShownBlock characters.
func showableBlock(s string) string { return escapeText(s, true, maxShownBlock) }

// escapeText writes s showable, keeping line breaks and tabs when block is set, clipped at limit
// characters.
func escapeText(s string, block bool, limit int) string {
	var b strings.Builder
	n := 0
	for i, r := range s {
		if n == limit {
			fmt.Fprintf(&b, "… (%d bytes in all)", len(s))
			break
		}
		n++
		switch {
		case r == utf8.RuneError && isInvalidAt(s, i):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case block && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029':
			if r > 0xffff {
				fmt.Fprintf(&b, `\U%08x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// isInvalidAt reports whether the RuneError at s[i] is an invalid byte rather than an encoded U+FFFD.
func isInvalidAt(s string, i int) bool {
	_, size := utf8.DecodeRuneInString(s[i:])
	return size == 1
}

// shownText is what a page shows of a text a message carries: redacted, then made showable.
func shownText(s string) string { return showable(redact.String(s)) }

// shownBlock is shownText for a block of text.
func shownBlock(s string) string { return showableBlock(redact.String(s)) }

// propertyValue is what the message page shows of an application property's value: binary values
// as their size (bytes are not text, and printing them as numbers would turn 60 kB into 240), times
// in UTC, anything else as text, redacted and made showable.
func propertyValue(v any) string {
	switch x := v.(type) {
	case []byte:
		return fmt.Sprintf("(%d bytes of binary data)", len(x))
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case string:
		return shownText(x)
	}
	return shownText(fmt.Sprint(v))
}
