// Package e2e runs package retry end to end through the real azservicebus SDK: by default against the
// in-process emulator (package sbemu) on loopback, and with the build tag "live" against the namespace
// named by SERVICEBUS_CONNECTION_STRING and SERVICEBUS_QUEUE (skipped when they are unset):
//
//	go test ./e2e/                      # emulator
//	go test -tags live -v ./e2e/        # a real namespace or Microsoft's emulator
//
// The live queue should have duplicate detection on and a lock duration of at least 30 s; tests that
// need fault injection are skipped there.
package e2e
