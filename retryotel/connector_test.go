package retryotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retryotel"
)

// fakeReceiver is a retry.Receiver whose renewals return renewErr and which counts its closes.
type fakeReceiver struct {
	renewErr error
	closed   int
}

func (r *fakeReceiver) ReceiveMessages(context.Context, int, *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	return nil, nil
}
func (r *fakeReceiver) CompleteMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.CompleteMessageOptions) error {
	return nil
}
func (r *fakeReceiver) DeadLetterMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeadLetterOptions) error {
	return nil
}
func (r *fakeReceiver) RenewMessageLock(context.Context, *azservicebus.ReceivedMessage, *azservicebus.RenewMessageLockOptions) error {
	return r.renewErr
}
func (r *fakeReceiver) Close(context.Context) error { r.closed++; return nil }

type fakeSender struct{ closed int }

func (s *fakeSender) ScheduleMessages(context.Context, []*azservicebus.Message, time.Time, *azservicebus.ScheduleMessagesOptions) ([]int64, error) {
	return []int64{1}, nil
}
func (s *fakeSender) Close(context.Context) error { s.closed++; return nil }

// A renewal outside any delivery (a message received ahead of its handler) is a root span of its own;
// a failed one carries error.type and an error status, on the span and on the operation metric.
func TestConnectorRenewalOutsideADelivery(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
	recv := &fakeReceiver{renewErr: &azservicebus.Error{Code: azservicebus.CodeLockLost}}
	conn, err := f.inst.Connector(func(context.Context) (*retry.Connection, error) {
		return &retry.Connection{Receiver: recv, Sender: &fakeSender{}, EntityPath: "orders"}, nil
	})(context.Background())
	require.NoError(t, err)
	err = conn.Receiver.RenewMessageLock(context.Background(), &azservicebus.ReceivedMessage{MessageID: "m-1"}, nil)
	require.ErrorIs(t, err, recv.renewErr)

	renewals := f.ended("renew_message_lock orders")
	require.Len(t, renewals, 1)
	s := renewals[0]
	assert.False(t, s.Parent().IsValid(), "no delivery to belong to")
	assert.Equal(t, codes.Error, s.Status().Code)
	a := attrs(s)
	assert.Equal(t, "locklost", a["error.type"].AsString())
	assert.Equal(t, "m-1", a["messaging.message.id"].AsString())
	assert.Equal(t, "orders", a["sbretry.source.name"].AsString())
	ops := find(t, f.metrics(), "messaging.client.operation.duration")
	assert.Equal(t, uint64(1), histogramCount(t, ops, attribute.String("messaging.operation.name", "renew_message_lock"), attribute.String("error.type", "locklost")))
}

// The wrapper passes the connection through: errors, every receiver wrapped, and closing a wrapped
// receiver (what the consumer does when Connection.Close is nil) closing the connector's own.
func TestConnectorPassesTheConnectionThrough(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
	boom := errors.New("boom")
	_, err := f.inst.Connector(func(context.Context) (*retry.Connection, error) { return nil, boom })(context.Background())
	require.ErrorIs(t, err, boom)

	main, also, sender := &fakeReceiver{}, &fakeReceiver{}, &fakeSender{}
	conn, err := f.inst.Connector(func(context.Context) (*retry.Connection, error) {
		return &retry.Connection{Receiver: main, Sender: sender, EntityPath: "events/Subscriptions/billing",
			Sources: []retry.Source{{Receiver: also, EntityPath: "billing-retry"}}}, nil
	})(context.Background())
	require.NoError(t, err)
	require.NoError(t, conn.Sources[0].Receiver.RenewMessageLock(context.Background(), &azservicebus.ReceivedMessage{}, nil))
	assert.Len(t, f.ended("renew_message_lock billing-retry"), 1)
	assert.Nil(t, conn.Close)
	assert.Same(t, sender, conn.Sender)
	require.NoError(t, conn.Receiver.Close(context.Background()))
	require.NoError(t, conn.Sources[0].Receiver.Close(context.Background()))
	assert.Equal(t, 1, main.closed)
	assert.Equal(t, 1, also.closed)
}

// Without Options.ServerAddress, server.address and server.port come from the connection's Address
// (which the built-in connectors set); with it, the Options win.
func TestConnectorLearnsTheServer(t *testing.T) {
	for name, tc := range map[string]struct {
		opts       retryotel.Options
		host       string
		port       int64
		hasPortKey bool
	}{
		"learned":       {host: "contoso.servicebus.windows.net", port: 5671, hasPortKey: true},
		"options first": {opts: retryotel.Options{ServerAddress: "alias.example"}, host: "alias.example"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, &fixtureOptions{otel: tc.opts})
			conn, err := f.inst.Connector(func(context.Context) (*retry.Connection, error) {
				return &retry.Connection{Receiver: &fakeReceiver{}, Sender: &fakeSender{}, EntityPath: "orders", Address: "contoso.servicebus.windows.net:5671"}, nil
			})(context.Background())
			require.NoError(t, err)
			require.NoError(t, conn.Receiver.RenewMessageLock(context.Background(), &azservicebus.ReceivedMessage{MessageID: "m-1"}, nil))
			a := attrs(f.ended("renew_message_lock orders")[0])
			assert.Equal(t, tc.host, a["server.address"].AsString())
			port, ok := a["server.port"]
			assert.Equal(t, tc.hasPortKey, ok)
			if ok {
				assert.Equal(t, tc.port, port.AsInt64())
			}
		})
	}
}

// sessionFakeReceiver is a fakeReceiver of one session, as a user's adapter around
// *azservicebus.SessionReceiver is.
type sessionFakeReceiver struct{ fakeReceiver }

func (*sessionFakeReceiver) SessionID() string { return "order-1" }

// A receiver of one session stays one through the wrapper, so that the consumer still refuses the
// session entity (retry.ErrSessionEntity) unless Options.AllowReorder; a plain receiver gets no
// SessionID method. Its renewals are still recorded.
func TestConnectorKeepsASessionReceiversSessionID(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
	connect := f.inst.Connector(func(context.Context) (*retry.Connection, error) {
		return &retry.Connection{Receiver: &sessionFakeReceiver{}, Sender: &fakeSender{}, EntityPath: "orders",
			Sources: []retry.Source{{Receiver: &fakeReceiver{}, EntityPath: "plain"}}}, nil
	})
	conn, err := connect(context.Background())
	require.NoError(t, err)
	s, ok := conn.Receiver.(interface{ SessionID() string })
	require.True(t, ok, "the wrapped session receiver still has SessionID")
	assert.Equal(t, "order-1", s.SessionID())
	_, ok = conn.Sources[0].Receiver.(interface{ SessionID() string })
	assert.False(t, ok, "a plain receiver gains no SessionID")
	require.NoError(t, conn.Receiver.RenewMessageLock(context.Background(), &azservicebus.ReceivedMessage{MessageID: "m-1"}, nil))
	assert.Len(t, f.ended("renew_message_lock orders"), 1)

	c, err := retry.NewConsumer(connect, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, &retry.Options{Logger: discard()})
	require.NoError(t, err)
	assert.ErrorIs(t, c.Run(t.Context()), retry.ErrSessionEntity)
}

// ctxReceiver is a retry.Receiver whose renewals end as the SDK's do when their context ends first:
// with the context's error, wrapped; or with err when set.
type ctxReceiver struct {
	fakeReceiver
	err error
}

func (r *ctxReceiver) RenewMessageLock(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	if r.err != nil {
		return r.err
	}
	<-ctx.Done()
	return fmt.Errorf("renewing the lock: %w", ctx.Err())
}

// A lock renewal the consumer cancels itself (the message settled, a shutdown) did not fail: its span
// has an unset status and no error.type, and neither has its operation-duration measurement. A renewal
// that ends with context.Canceled its caller did not cause, one that timed out, and a lost lock are
// failures.
func TestRenewalCancelledByTheConsumerIsNotAnError(t *testing.T) {
	cases := []struct {
		name    string
		err     error // the receiver's answer; nil: wait for the context
		cancel  bool  // the caller cancels the call's context
		timeout bool  // the call's context has a deadline that passes
		errType string
	}{
		{name: "cancelled by the consumer", cancel: true},
		{name: "canceled, not by the consumer", err: context.Canceled, errType: "canceled"},
		{name: "timed out", timeout: true, errType: "timeout"},
		{name: "lock lost", err: &azservicebus.Error{Code: azservicebus.CodeLockLost}, errType: "locklost"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
			conn, err := f.inst.Connector(func(context.Context) (*retry.Connection, error) {
				return &retry.Connection{Receiver: &ctxReceiver{err: tc.err}, Sender: &fakeSender{}, EntityPath: "orders"}, nil
			})(context.Background())
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			if tc.timeout {
				var stop context.CancelFunc
				ctx, stop = context.WithDeadline(ctx, time.Now())
				defer stop()
			}
			err = conn.Receiver.RenewMessageLock(ctx, &azservicebus.ReceivedMessage{MessageID: "m-1"}, nil)
			require.Error(t, err, "the caller still sees the call's error")

			renewals := f.ended("renew_message_lock orders")
			require.Len(t, renewals, 1)
			s := renewals[0]
			ops := find(t, f.metrics(), "messaging.client.operation.duration")
			renew := attribute.String("messaging.operation.name", "renew_message_lock")
			if tc.errType == "" {
				assert.Equal(t, codes.Unset, s.Status().Code)
				assert.NotContains(t, attrs(s), attribute.Key("error.type"))
				assert.Equal(t, uint64(1), histogramCount(t, ops, renew))
				for _, set := range dataPoints(ops) {
					assert.False(t, set.HasValue("error.type"), "no error.type on the measurement")
				}
				return
			}
			assert.Equal(t, codes.Error, s.Status().Code)
			assert.Equal(t, tc.errType, attrs(s)["error.type"].AsString())
			assert.Equal(t, uint64(1), histogramCount(t, ops, renew, attribute.String("error.type", tc.errType)))
		})
	}
}
