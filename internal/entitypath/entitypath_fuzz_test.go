package entitypath_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sbretry/retry/internal/entitypath"
)

// FuzzSplit checks Split against Subscription on any input: what Split accepts is exactly what
// Subscription writes for its parts (up to the letter case of the middle segment), with a subscription
// free of '/'.
func FuzzSplit(f *testing.F) {
	for _, tc := range splitCases {
		f.Add(tc.path)
	}
	f.Fuzz(func(t *testing.T, path string) {
		topic, sub, ok := entitypath.Split(path)
		if !ok {
			if topic != "" || sub != "" {
				t.Fatalf("Split(%q) refused the path but returned %q, %q", path, topic, sub)
			}
			return
		}
		if strings.Contains(sub, "/") {
			t.Fatalf("Split(%q): subscription %q contains '/'", path, sub)
		}
		joined := entitypath.Subscription(topic, sub)
		if !strings.EqualFold(joined, path) || !strings.HasPrefix(path, topic+"/") || !strings.HasSuffix(path, "/"+sub) {
			t.Fatalf("Split(%q) = %q, %q, which Subscription joins to %q", path, topic, sub, joined)
		}
		// The other way round: Split reads back what Subscription wrote.
		if t2, s2, ok := entitypath.Split(joined); !ok || t2 != topic || s2 != sub {
			t.Fatalf("Split(Subscription(%q, %q)) = %q, %q, %v", topic, sub, t2, s2, ok)
		}
	})
}

// FuzzParse checks that Parse never panics, that what it accepts has no empty name and writes back to
// the same path (up to the letter case of the middle segment), and that it reads its own Path back.
func FuzzParse(f *testing.F) {
	for _, tc := range parseCases {
		f.Add(tc.path)
	}
	f.Fuzz(func(t *testing.T, path string) {
		e, err := entitypath.Parse(path)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(path)) {
				t.Fatalf("Parse(%q): the error %q does not quote the path", path, err)
			}
			return
		}
		if e.IsSubscription() {
			if e.Queue != "" || strings.TrimSpace(e.Topic) == "" || strings.TrimSpace(e.Subscription) == "" || strings.ContainsRune(e.Topic+e.Subscription, '/') {
				t.Fatalf("Parse(%q) = %+v", path, e)
			}
		} else if strings.TrimSpace(e.Queue) == "" || strings.Contains(e.Queue, "/") || e.Subscription != "" {
			t.Fatalf("Parse(%q) = %+v", path, e)
		}
		if !strings.EqualFold(e.Path(), path) {
			t.Fatalf("Parse(%q).Path() = %q", path, e.Path())
		}
		if again, err := entitypath.Parse(e.Path()); err != nil || again != e {
			t.Fatalf("Parse(Parse(%q).Path()) = %+v, %v; want %+v", path, again, err, e)
		}
	})
}
