// Package loopback tells loopback host names from others: the guard against DNS rebinding of a local
// HTTP endpoint that has no access token. A page on another origin that rebinds its own name to
// 127.0.0.1 reaches the endpoint with its own name in the Host header; only a loopback name (or one
// the operator allowed) is the endpoint's own.
package loopback

import (
	"net"
	"strings"
)

// IsHost reports whether host (a name or address, without port or brackets) is "localhost" or a
// loopback address.
func IsHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// HostOf returns the host of an HTTP Host header ("name:port", "[::1]:80", "name"), without port or
// brackets.
func HostOf(hostHeader string) string {
	host, _, err := net.SplitHostPort(hostHeader)
	if err != nil {
		host = hostHeader
	}
	// "localhost." is the fully qualified form of the same name.
	return strings.TrimSuffix(strings.Trim(host, "[]"), ".")
}

// Allowed reports whether the Host header names a loopback host or one of allowed (compared without
// case).
func Allowed(hostHeader string, allowed []string) bool {
	host := HostOf(hostHeader)
	if IsHost(host) {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(a, host) {
			return true
		}
	}
	return false
}
