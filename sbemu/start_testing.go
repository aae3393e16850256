package sbemu

import "testing"

// StartT starts an emulator for one test or benchmark and registers its
// [Emulator.Close] with tb.Cleanup, so a test needs one line:
//
//	em := sbemu.StartT(t, sbemu.Config{Queues: []broker.QueueConfig{{Name: "orders"}}})
//	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), nil)
//
// An empty cfg.Addr listens on a free loopback port, so parallel tests never
// collide. A start-up error, or an error from Close at cleanup, fails tb. The
// emulator closes after cleanups registered later (such as closing the
// client), because cleanups run last-registered first.
func StartT(tb testing.TB, cfg Config) *Emulator {
	tb.Helper()
	em, err := Start(cfg)
	if err != nil {
		tb.Fatalf("sbemu: starting emulator: %v", err)
	}
	tb.Cleanup(func() {
		if err := em.Close(); err != nil {
			tb.Errorf("sbemu: closing emulator: %v", err)
		}
	})
	return em
}
