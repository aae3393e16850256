// Package conformance drives Microsoft's other Service Bus SDKs against the
// emulator, to check that it behaves like Service Bus on the wire for them
// too and not only for the Go SDK it was built against. Each client is a
// small program (js/conformance.mjs for @azure/service-bus) that runs a
// fixed list of checks and reports each as a JSON line; the Go test starts
// an emulator, runs the program and turns every check into a subtest.
//
// The clients are optional: a test whose runtime or packages are missing is
// skipped with a message saying how to install them (for JavaScript, `npm
// ci` in conformance/js). The Go suite stays the gate.
package conformance
