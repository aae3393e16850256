package entitypath_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/internal/entitypath"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSubscription(t *testing.T) {
	assert.Equal(t, "events/Subscriptions/billing", entitypath.Subscription("events", "billing"))
	assert.Equal(t, "a/b/Subscriptions/c", entitypath.Subscription("a/b", "c"), "a topic name may contain '/'")
}

// splitCases double as seeds for FuzzSplit.
var splitCases = []struct {
	name, path, topic, sub string
	ok                     bool
}{
	{name: "subscription", path: "events/Subscriptions/billing", topic: "events", sub: "billing", ok: true},
	{name: "segment in lower case", path: "events/subscriptions/billing", topic: "events", sub: "billing", ok: true},
	{name: "segment in upper case", path: "events/SUBSCRIPTIONS/billing", topic: "events", sub: "billing", ok: true},
	{name: "topic with a slash", path: "a/b/Subscriptions/c", topic: "a/b", sub: "c", ok: true},
	{name: "topic named like the segment", path: "Subscriptions/Subscriptions/x", topic: "Subscriptions", sub: "x", ok: true},
	{name: "empty subscription", path: "events/Subscriptions/", topic: "events", sub: "", ok: true},
	{name: "empty topic", path: "/Subscriptions/billing", topic: "", sub: "billing", ok: true},
	{name: "queue", path: "orders"},
	{name: "empty", path: ""},
	{name: "two segments", path: "events/billing"},
	{name: "wrong middle", path: "events/Subs/billing"},
	{name: "segment alone", path: "Subscriptions/billing"},
	{name: "dead-letter queue of a subscription", path: "events/Subscriptions/billing/$DeadLetterQueue"},
	{name: "subscription with a slash", path: "events/Subscriptions/billing/more"},
	{name: "dead-letter queue of a queue", path: "orders/$DeadLetterQueue"},
}

func TestSplit(t *testing.T) {
	for _, tc := range splitCases {
		t.Run(tc.name, func(t *testing.T) {
			topic, sub, ok := entitypath.Split(tc.path)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.topic, topic)
			assert.Equal(t, tc.sub, sub)
		})
	}
}

// parseCases double as seeds for FuzzParse.
var parseCases = []struct {
	name, path string
	want       entitypath.Entity
	wantPath   string
	wantErr    bool
}{
	{name: "queue", path: "orders", want: entitypath.Entity{Queue: "orders"}, wantPath: "orders"},
	{name: "subscription", path: "events/Subscriptions/billing", want: entitypath.Entity{Topic: "events", Subscription: "billing"}, wantPath: "events/Subscriptions/billing"},
	{name: "subscription lower case", path: "events/subscriptions/billing", want: entitypath.Entity{Topic: "events", Subscription: "billing"}, wantPath: "events/Subscriptions/billing"},
	{name: "empty", path: "", wantErr: true},
	{name: "blank", path: "  ", wantErr: true},
	{name: "two segments", path: "events/billing", wantErr: true},
	{name: "empty subscription", path: "events/Subscriptions/", wantErr: true},
	{name: "blank subscription", path: "events/Subscriptions/ ", wantErr: true},
	{name: "empty topic", path: "/Subscriptions/billing", wantErr: true},
	{name: "wrong middle", path: "events/Subs/billing", wantErr: true},
	{name: "topic with a slash", path: "a/b/Subscriptions/c", wantErr: true},
	{name: "dead-letter queue", path: "events/Subscriptions/billing/$DeadLetterQueue", wantErr: true},
	{name: "queue with a slash", path: "orders/", wantErr: true},
}

func TestParse(t *testing.T) {
	for _, tc := range parseCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := entitypath.Parse(tc.path)
			if tc.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "entity "+`"`+tc.path+`"`, "the error quotes the path")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.wantPath, got.Path())
			assert.Equal(t, tc.want.Topic != "", got.IsSubscription())
		})
	}
}

func TestParseErrorNamesTheForm(t *testing.T) {
	_, err := entitypath.Parse("events/billing")
	require.Error(t, err)
	assert.Equal(t, `entity "events/billing" is neither a queue name nor "<topic>/Subscriptions/<subscription>"`, err.Error())
	_, err = entitypath.Parse("events//billing")
	require.Error(t, err)
	assert.Equal(t, `entity "events//billing" has an empty name`, err.Error())
}
