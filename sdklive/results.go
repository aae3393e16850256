package main

import (
	"fmt"
	"html"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// maxReason bounds a reason so that each test stays on one readable line.
const maxReason = 200

var (
	// testifyError matches the "Error:" field of a testify failure; its message follows, possibly on
	// continuation lines that start with a tab.
	testifyError = regexp.MustCompile(`^\s+Error:\s+(.*)$`)
	// testifyCont matches a continuation line of a testify field: blanks where the field's name
	// would be, between two tabs.
	testifyCont = regexp.MustCompile(`^\s*\t +\t(.*)$`)
	// logLine matches a t.Log, t.Error or t.Skip line: "    file_test.go:12: message".
	logLine = regexp.MustCompile(`^\s+(\w+\.go:\d+): (\S.*)$`)
)

// verdict reads a test binary's -test.v output for one top-level test and returns PASS, FAIL or SKIP
// with a one-line reason for the last two.
func verdict(name, out string) (status, reason string) {
	lines := strings.Split(out, "\n")
	status = "FAIL"
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "--- PASS: "+name+" "):
			return "PASS", ""
		case strings.HasPrefix(l, "--- SKIP: "+name+" "):
			status = "SKIP"
		}
	}
	if status == "SKIP" {
		for _, l := range lines {
			if m := logLine.FindStringSubmatch(l); m != nil {
				return status, clip(m[2])
			}
		}
		return status, ""
	}
	for i, l := range lines {
		if strings.HasPrefix(l, "panic: test timed out after") {
			return status, clip(strings.TrimPrefix(l, "panic: "))
		}
		if m := testifyError.FindStringSubmatch(l); m != nil {
			parts := []string{strings.TrimSpace(m[1])}
			for _, c := range lines[i+1:] {
				cm := testifyCont.FindStringSubmatch(c)
				if cm == nil {
					break
				}
				parts = append(parts, cm[1])
			}
			return status, clip(summarizeHTTPError(strings.Join(parts, " ")))
		}
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "panic: ") {
			return status, clip(l)
		}
	}
	for _, l := range lines {
		if m := logLine.FindStringSubmatch(l); m != nil {
			return status, clip(m[1] + ": " + m[2])
		}
	}
	return status, ""
}

var (
	// httpErrorShape matches azcore's ResponseError text: the request line,
	// a rule, then "RESPONSE 400: 400 Bad Request" and the body.
	httpErrorShape = regexp.MustCompile(`^(.*?)(?:\b(?:GET|PUT|DELETE|POST) (\S+))\s*-{10,}\s*RESPONSE (\d{3})`)
	// errorDetail is the emulator's (and Service Bus's) error detail.
	errorDetail = regexp.MustCompile(`<Detail>(.*?)</Detail>`)
)

// summarizeHTTPError shortens an admin API failure to its request, status
// and detail, which is the part that says why; other text is unchanged.
func summarizeHTTPError(s string) string {
	m := httpErrorShape.FindStringSubmatch(s)
	if m == nil {
		return s
	}
	out := strings.TrimSpace(m[1]) + " " + m[3]
	if u, err := url.Parse(m[2]); err == nil {
		out += " " + u.Path
	}
	if d := errorDetail.FindStringSubmatch(s); d != nil {
		out += ": " + html.UnescapeString(d[1])
	}
	return out
}

// clip shortens s to maxReason bytes (on a rune boundary) and makes it one line.
func clip(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= maxReason {
		return s
	}
	cut := maxReason
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// writeResults writes the results as a Markdown table, with the summary line first.
func writeResults(path string, results []result, passed, ran, parallel int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# azservicebus live tests against sbemu\n\n")
	flags := ""
	if parallel > 1 {
		flags = fmt.Sprintf("-parallel %d ", parallel)
	}
	fmt.Fprintf(&b, "Written by `go run ./sdklive %s-results %s` (`make sdk-live`); see sdklive/main.go.\n\n", flags, path)
	fmt.Fprintf(&b, "**%d/%d passed.**\n\n", passed, ran)
	fmt.Fprintf(&b, "| Result | Package | Test | Reason |\n|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.status, pkgLabel(r.tc.pkg), r.tc.name, strings.ReplaceAll(r.reason, "|", `\|`))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
