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
// API does not accept Listen or Send tokens).
//
// # Health
//
// A monitor that cannot read the counts alerts nobody, so its failures are
// counted: [Monitor.Health] reports the polls, the failed reads, the
// latest error and each entity's state, and [HealthHandler] serves it as a
// readiness probe that answers 503 while the latest poll failed to read an
// entity. Every error names the entity and, when the administration
// client's error carries the request URL, the endpoint.
//
// # Telemetry
//
// The package depends on no telemetry library. To trace its reads and feed a
// dead-letter depth gauge, wrap the admin client with
// github.com/sbretry/retry/retryotel's Instrumentation.AdminClient, which
// returns an [AdminClient]: every read becomes an OpenTelemetry span, and the
// count it read sets the gauge sbretry.dead_letter.depth.
//
//	m, err := dlqmonitor.New(inst.AdminClient(ac), entities, opts)
//
// # Against the sbemu emulator
//
// In the same process, pass sbemu's Emulator.AdminClientOptions to the
// admin client. Next to a standalone cmd/sbemu started with -data DIR,
// build them from the directory, which keeps the emulator's certificate
// authority and names its admin address; the monitor then keeps working
// across restarts of the emulator:
//
//	opts, err := sbemu.AdminClientOptionsFromDir("./sbemu-data")
//	ac, err := admin.NewClientFromConnectionString(connStr, opts) // the line cmd/sbemu printed
//
// The monitor only reads: it never peeks, receives or changes anything, so
// it can run next to consumers and next to operators redriving dead letters.
package dlqmonitor
