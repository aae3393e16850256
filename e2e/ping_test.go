package e2e

import (
	"fmt"
	"sync"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/require"
)

// The receive loops of one connection (a subscription and its retry queue) may probe it at the same
// time. The probe peeks; it must not share the SDK receiver's unguarded peek position, or the race
// detector fails this test (the position is written only when a peek finds a message, so the queue
// holds more than the probes peek).
func TestConcurrentProbesOfOneConnection(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	msgs := make([]*azservicebus.Message, 40)
	for i := range msgs {
		id := fmt.Sprintf("resting-%d", i)
		msgs[i] = &azservicebus.Message{MessageID: &id, Body: []byte("x")}
	}
	e.send(t, msgs...)
	conn, err := e.connector()(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(t.Context()) })
	require.NotNil(t, conn.Ping)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 2 {
		wg.Go(func() {
			for range 10 {
				errs <- conn.Ping(t.Context())
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
