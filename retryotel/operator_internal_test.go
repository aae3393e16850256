package retryotel

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// An inspector path is split into the entity and whether it is that entity's dead-letter queue,
// ignoring case as Service Bus does.
func TestOperatorEntity(t *testing.T) {
	for _, tc := range []struct {
		path       string
		want       destination
		deadLetter bool
	}{
		{"orders", destination{name: "orders"}, false},
		{"orders/$DeadLetterQueue", destination{name: "orders"}, true},
		{"orders/$deadletterqueue", destination{name: "orders"}, true},
		{"events/Subscriptions/billing", destination{name: "events", subscription: "billing"}, false},
		{"events/subscriptions/billing/$DeadLetterQueue", destination{name: "events", subscription: "billing"}, true},
		{"$DeadLetterQueue", destination{name: "$DeadLetterQueue"}, false},
		{"", destination{}, false},
	} {
		got, dl := operatorEntity(tc.path)
		assert.Equal(t, tc.want, got, tc.path)
		assert.Equal(t, tc.deadLetter, dl, tc.path)
	}
}
