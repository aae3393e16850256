package retrytest

import (
	"maps"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// cloneMessage deep-copies m so that neither the test nor the code under test can alter what
// [Broker.Scheduled] recorded.
func cloneMessage(m *azservicebus.Message) *azservicebus.Message {
	c := *m
	if m.Body != nil {
		c.Body = append([]byte(nil), m.Body...)
	}
	if m.ApplicationProperties != nil {
		c.ApplicationProperties = maps.Clone(m.ApplicationProperties)
		for k, v := range c.ApplicationProperties {
			if b, ok := v.([]byte); ok {
				c.ApplicationProperties[k] = append([]byte(nil), b...)
			}
		}
	}
	for _, p := range []**string{&c.ContentType, &c.CorrelationID, &c.MessageID, &c.PartitionKey, &c.ReplyTo, &c.ReplyToSessionID, &c.SessionID, &c.Subject, &c.To} {
		if *p != nil {
			s := **p
			*p = &s
		}
	}
	if m.TimeToLive != nil {
		d := *m.TimeToLive
		c.TimeToLive = &d
	}
	if m.ScheduledEnqueueTime != nil {
		t := *m.ScheduledEnqueueTime
		c.ScheduledEnqueueTime = &t
	}
	return &c
}
