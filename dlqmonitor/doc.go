// Package dlqmonitor alerts on dead-letter depth: it polls the
// DeadLetterMessageCount of each configured queue and subscription through
// the Service Bus administration API and calls a hook when the count
// reaches a threshold, one message by default.
//
// A dead-letter queue that nobody watches is just a slower way to lose
// messages. Service Bus never deletes dead letters and never tells anyone
// they arrived, so even one message should trigger a look: the monitor's
// default [Options.Threshold] is 1.
//
//	ac, err := admin.NewClientFromConnectionString(connStr, nil)
//	m, err := dlqmonitor.New(ac, []string{"orders", "events/Subscriptions/billing"}, &dlqmonitor.Options{
//		OnDeadLetters: func(p dlqmonitor.DeadLetterParams) {
//			log.Printf("%s: %d dead letters (%d new)", p.Entity, p.Count, p.New)
//		},
//	})
//	err = m.Run(ctx) // polls every minute until ctx ends
//
// Each poll reads one runtime-properties document per entity (an HTTPS GET
// of "<entity>" under the namespace), so the cost on the namespace is
// small and bounded: see [Options.Interval] and [Options.Timeout]. The
// admin client needs Manage rights on the namespace or the entities (the
// API does not accept Listen or Send tokens). Against the sbemu emulator,
// pass sbemu's Emulator.AdminClientOptions to the admin client.
//
// The monitor only reads: it never peeks, receives or changes anything, so
// it can run next to consumers and next to operators redriving dead letters.
package dlqmonitor
