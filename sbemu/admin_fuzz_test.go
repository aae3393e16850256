package sbemu

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
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
