// Package conformance drives Microsoft's other Service Bus SDKs against the
// emulator, to check that it behaves like Service Bus on the wire for them
// too and not only for the Go SDK it was built against. Each client is a
// small program (js/conformance.mjs for @azure/service-bus,
// python/conformance.py for azure-servicebus) that runs a fixed list of
// checks and reports each as a JSON line; the Go test starts an emulator,
// runs the program, answers its requests (such as "expire the locks now",
// so no client waits on a clock) and turns every check into a subtest.
//
// The clients are optional: a test whose runtime or packages are missing is
// skipped with a message saying how to install them (`npm install` in
// conformance/js; Debian's python3-azure). .ci/run installs both when it
// can. The Go suite stays the gate.
//
// The Python SDK Debian ships (7.8.2) predates the UseDevelopmentEmulator
// connection-string setting and always uses AMQP over TLS on port 5671, so
// its run serves TLS ([sbemu.Config.TLS]) on 127.0.0.1:5671 with a
// certificate made for the test, and skips if that port is taken. Its
// transport, uamqp 1.5.3, sometimes crashes under load (see pythonOptIn), so
// the Python run is opt-in (SBEMU_CONFORMANCE_PYTHON=1) and not part of the
// gate; .ci/run runs it on its own before `make test`.
package conformance
