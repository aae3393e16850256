package retryotel_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/retryotel"
)

func TestServerFromConnectionString(t *testing.T) {
	tests := []struct {
		name, cs string
		host     string
		port     int
		wantErr  bool
	}{
		{name: "azure", cs: "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s", host: "contoso.servicebus.windows.net", port: 5671},
		{name: "explicit port", cs: "Endpoint=sb://localhost:5673;SharedAccessKey=s", host: "localhost", port: 5673},
		{name: "emulator", cs: "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=s;UseDevelopmentEmulator=true", host: "localhost", port: 5672},
		{name: "emulator before an explicit port", cs: "UseDevelopmentEmulator=true;Endpoint=sb://localhost:6000", host: "localhost", port: 6000},
		{name: "keys in any case and spaces", cs: " endpoint = sb://ns.example/ ; usedevelopmentemulator = TRUE", host: "ns.example", port: 5672},
		{name: "no endpoint", cs: "SharedAccessKeyName=k;SharedAccessKey=s", wantErr: true},
		{name: "endpoint without host", cs: "Endpoint=sb:///", wantErr: true},
		{name: "bad port", cs: "Endpoint=sb://ns:99999/", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host, port, err := retryotel.ServerFromConnectionString(tt.cs)
			if tt.wantErr {
				require.Error(t, err)
				assert.NotContains(t, err.Error(), "SharedAccessKey")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.host, host)
			assert.Equal(t, tt.port, port)
		})
	}
}

// Whatever the string, the result is a host and a valid port, or an error; the key never shows.
func FuzzServerFromConnectionString(f *testing.F) {
	f.Add("Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKey=s3cr3t")
	f.Add("Endpoint=sb://localhost:5672;UseDevelopmentEmulator=true")
	f.Add(";;=;Endpoint=")
	f.Fuzz(func(t *testing.T, cs string) {
		host, port, err := retryotel.ServerFromConnectionString(cs)
		if err != nil {
			assert.Empty(t, host)
			assert.NotContains(t, err.Error(), "s3cr3t")
			return
		}
		assert.NotEmpty(t, host)
		assert.True(t, port > 0 && port <= 65535, "port %d", port)
		assert.False(t, strings.Contains(host, ";"), "host %q", host)
	})
}

func TestNewRefusesAPortOutOfRange(t *testing.T) {
	for _, p := range []int{-1, 65536} {
		_, err := retryotel.New(&retryotel.Options{ServerAddress: "ns", ServerPort: p})
		assert.Error(t, err, "port %d", p)
	}
}
