package sbemu

import (
	"bytes"
	"encoding/xml"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzAdminPut sends arbitrary bodies to the administration API's PUT
// routes, straight to the handler: whatever arrives, the server answers
// with a status and never panics, and a refused request changes nothing.
func FuzzAdminPut(f *testing.F) {
	seeds := []string{
		`<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><QueueDescription><LockDuration>PT30S</LockDuration><MaxDeliveryCount>3</MaxDeliveryCount></QueueDescription></content></entry>`,
		`<entry><content><TopicDescription><RequiresDuplicateDetection>true</RequiresDuplicateDetection><DuplicateDetectionHistoryTimeWindow>P1D</DuplicateDetectionHistoryTimeWindow></TopicDescription></content></entry>`,
		`<entry><content><SubscriptionDescription><DefaultRuleDescription><Filter xmlns:i="http://www.w3.org/2001/XMLSchema-instance" i:type="SqlFilter"><SqlExpression>a = 1</SqlExpression></Filter><Name>r</Name></DefaultRuleDescription></SubscriptionDescription></content></entry>`,
		`<entry><content><RuleDescription><Filter xmlns:i="http://www.w3.org/2001/XMLSchema-instance" i:type="CorrelationFilter"><Properties><KeyValueOfstringanyType><Key>k</Key><Value i:type="d:int">x</Value></KeyValueOfstringanyType></Properties></Filter></RuleDescription></content></entry>`,
		`<entry><content><QueueDescription><LockDuration>P99999999999D</LockDuration></QueueDescription></content></entry>`,
		`<entry><content><TopicDescription><AutoDeleteOnIdle>PT7M</AutoDeleteOnIdle><EnablePartitioning>true</EnablePartitioning><MaxSizeInMegabytes>2147483647</MaxSizeInMegabytes></TopicDescription></content></entry>`,
		`<entry><content><QueueDescription><AutoDeleteOnIdle>PT1S</AutoDeleteOnIdle><MaxSizeInMegabytes>-1</MaxSizeInMegabytes><ForwardTo>sb://%zz/q</ForwardTo></QueueDescription></content></entry>`,
		`<entry><content><QueueDescription><AuthorizationRules><AuthorizationRule xmlns:i="http://www.w3.org/2001/XMLSchema-instance" i:type="SharedAccessAuthorizationRule"><Rights><AccessRights>Send</AccessRights></Rights><KeyName>k</KeyName></AuthorizationRule></AuthorizationRules><Status>ReceiveDisabled</Status></QueueDescription></content></entry>`,
		`<entry><content><TopicDescription><AuthorizationRules><AuthorizationRule><Rights><AccessRights>Own</AccessRights></Rights></AuthorizationRule></AuthorizationRules><Status>Restoring</Status></TopicDescription></content></entry>`,
		`not xml`,
	}
	for _, s := range seeds {
		f.Add(s, "/fuzzq")
		f.Add(s, "/fuzzt/Subscriptions/s")
		f.Add(s, "/fuzzt/Subscriptions/s/Rules/r")
	}
	em, err := Start(Config{InMemory: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = em.Close() })
	f.Fuzz(func(t *testing.T, body, path string) {
		req, err := http.NewRequest(http.MethodPut, "https://fuzz.example", bytes.NewReader([]byte(body)))
		if err != nil {
			return
		}
		req.URL.Path = path
		rec := httptest.NewRecorder()
		em.admin.serveHTTP(rec, req)
		if rec.Code < 200 || rec.Code > 599 {
			t.Fatalf("status %d", rec.Code)
		}
	})
}

// FuzzErrorBody: whatever the detail (entity names and other client
// input end up in it), the error document is well-formed XML whose Detail
// reads back as the detail, with the characters XML cannot hold replaced.
func FuzzErrorBody(f *testing.F) {
	for _, s := range []string{"Unauthorized access for 'GetSubscription'", "a < b & c > d", "\x00\xff", "\"quoted\"", "]]>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, detail string) {
		var doc struct {
			Code   int    `xml:"Code"`
			Detail string `xml:"Detail"`
		}
		if err := xml.Unmarshal([]byte(errorBody(401, detail)), &doc); err != nil {
			t.Fatalf("errorBody(%q) is not XML: %v", detail, err)
		}
		var b strings.Builder
		for _, r := range detail { // an invalid byte reads as utf8.RuneError
			if r == '\t' || r == '\n' || r == '\r' || r >= 0x20 && r < 0xD800 || r >= 0xE000 && r < 0xFFFE || r >= 0x10000 {
				b.WriteRune(r)
			} else {
				b.WriteRune(utf8.RuneError)
			}
		}
		want := b.String()
		// XML reads a carriage return as a line feed.
		want = strings.ReplaceAll(strings.ReplaceAll(want, "\r\n", "\n"), "\r", "\n")
		if doc.Code != 401 || doc.Detail != want {
			t.Fatalf("errorBody(%q) reads back as %d %q, want %q", detail, doc.Code, doc.Detail, want)
		}
	})
}
