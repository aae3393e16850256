package retryotel

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// ServerFromConnectionString returns the namespace host and port a Service Bus connection string
// addresses, for [Options].ServerAddress and ServerPort: the host of its Endpoint, and the Endpoint's
// port if it names one, else 5672 when UseDevelopmentEmulator=true (the emulator's plain AMQP port),
// else 5671 (AMQP over TLS), the same address the core's connectors dial. It reads nothing else of
// the string (the key never leaves it) and fails when there is no sb:// Endpoint with a host.
func ServerFromConnectionString(connectionString string) (address string, port int, err error) {
	port = 5671
	explicit := false
	for _, part := range strings.Split(connectionString, ";") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case strings.EqualFold(k, "Endpoint"):
			u, perr := url.Parse(v)
			if perr != nil || u.Hostname() == "" {
				return "", 0, errors.New("retryotel: the connection string's Endpoint is not a URL with a host")
			}
			address = u.Hostname()
			if p := u.Port(); p != "" {
				n, perr := strconv.Atoi(p)
				if perr != nil || n <= 0 || n > 65535 {
					return "", 0, errors.New("retryotel: the connection string's Endpoint has an invalid port")
				}
				port, explicit = n, true
			}
		case strings.EqualFold(k, "UseDevelopmentEmulator") && strings.EqualFold(v, "true") && !explicit:
			port = 5672
		}
	}
	if address == "" {
		return "", 0, errors.New("retryotel: the connection string has no Endpoint")
	}
	return address, port, nil
}
