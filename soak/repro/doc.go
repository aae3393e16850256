//go:build repro

// Package repro holds minimal reproductions of the defects the soak found (see soak/README.md,
// "Findings"). Each test asserts the correct behaviour, so it fails while the defect exists; they are
// behind the "repro" build tag to keep make test green meanwhile:
//
//	go test -tags repro -v ./soak/repro/
package repro
