package retry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
)

func TestMatchers(t *testing.T) {
	msg := func(subject, contentType string, props map[string]any) *azservicebus.ReceivedMessage {
		m := &azservicebus.ReceivedMessage{ApplicationProperties: props}
		if subject != "" {
			m.Subject = &subject
		}
		if contentType != "" {
			m.ContentType = &contentType
		}
		return m
	}
	cases := []struct {
		name  string
		match retry.Matcher
		msg   *azservicebus.ReceivedMessage
		want  bool
	}{
		{"subject", retry.Subject("order.created"), msg("order.created", "", nil), true},
		{"subject is exact", retry.Subject("order.created"), msg("Order.Created", "", nil), false},
		{"no subject", retry.Subject(""), msg("", "", nil), false},
		{"content type", retry.ContentType("application/json"), msg("", "application/json", nil), true},
		{"content type without case or parameters", retry.ContentType("application/json"), msg("", "Application/JSON; charset=utf-8", nil), true},
		{"parameters on the route's side too", retry.ContentType("application/json; charset=utf-8"), msg("", "application/json", nil), true},
		{"another content type", retry.ContentType("application/json"), msg("", "application/xml", nil), false},
		{"a content type that does not parse", retry.ContentType("application/json"), msg("", "application/json; =", nil), false},
		{"no content type", retry.ContentType("application/json"), msg("", "", nil), false},
		{"string property", retry.Property("type", "refund"), msg("", "", map[string]any{"type": "refund"}), true},
		{"int64 property", retry.Property("version", int64(2)), msg("", "", map[string]any{"version": int64(2)}), true},
		{"an int32 is not an int64", retry.Property("version", int64(2)), msg("", "", map[string]any{"version": int32(2)}), false},
		{"another value", retry.Property("type", "refund"), msg("", "", map[string]any{"type": "sale"}), false},
		{"missing property", retry.Property("type", "refund"), msg("", "", nil), false},
		{"a []byte property never panics", retry.Property("raw", []byte("x")), msg("", "", map[string]any{"raw": []byte("x")}), false},
		{"a []byte value against a string", retry.Property("raw", "x"), msg("", "", map[string]any{"raw": []byte("x")}), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.match(tc.msg))
		})
	}
}

func FuzzRouterNeverPanics(f *testing.F) {
	f.Add("order.created", "application/json", "type", "refund")
	f.Add("", "text/plain; charset=\"", "", "")
	f.Add("\x00", "a/b; c=d; c=e", "type", "\xff")
	f.Fuzz(func(t *testing.T, subject, contentType, prop, value string) {
		var routed string
		handler := func(name string) retry.Handler {
			return func(context.Context, *azservicebus.ReceivedMessage) error {
				routed = name
				return nil
			}
		}
		r, err := retry.NewRouter([]retry.Route{
			{Name: "subject", Match: retry.Subject("order.created"), Handler: handler("subject")},
			{Name: "json", Match: retry.ContentType("application/json"), Handler: handler("json")},
			{Name: "type", Match: retry.Property("type", "refund"), Handler: handler("type")},
		}, nil)
		require.NoError(t, err)
		m := &azservicebus.ReceivedMessage{Subject: &subject, ContentType: &contentType, ApplicationProperties: map[string]any{prop: value}}
		err = r.Handle(t.Context(), m)
		switch {
		case subject == "order.created":
			assert.Equal(t, "subject", routed)
		case routed == "":
			require.ErrorIs(t, err, retry.ErrNoRoute)
			assert.False(t, prop == "type" && value == "refund", "the property route must take it")
		default:
			require.NoError(t, err)
		}
	})
}

func TestRouterPicksTheFirstRouteAndItsPolicies(t *testing.T) {
	errStock := errors.New("out of stock")
	calls := map[string]int{}
	route := func(name string, err error) retry.Handler {
		return func(context.Context, *azservicebus.ReceivedMessage) error {
			calls[name]++
			return err
		}
	}
	r, err := retry.NewRouter([]retry.Route{
		{Name: "orders", Match: retry.Subject("orders"), Handler: route("orders", errStock), Policies: []retry.Rule{
			{Name: "stock", Match: retry.ErrorIs(errStock), Policy: retry.Policy{Backoff: backoff.Constant{Interval: 30 * time.Minute}}},
		}},
		{Name: "also orders", Match: retry.Subject("orders"), Handler: route("also orders", nil)},
		{Name: "refunds", Match: retry.Property("tenant", "acme"), Handler: route("refunds", errStock)},
	}, nil)
	require.NoError(t, err)
	opts := &retry.Options{Policies: []retry.Rule{{Name: "global stock", Match: retry.ErrorIs(errStock), Policy: retry.Policy{Backoff: backoff.Constant{Interval: time.Minute}}}}}

	f := newFixture(t, r.Handle, opts)
	f.broker.Send(sampleMessage()) // Subject "orders", tenant "acme"
	res := f.process()
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.Equal(t, map[string]int{"orders": 1}, calls, "the first route that matches")
	assert.Equal(t, "stock", res.Policy, "the route's rules before the Options'")
	assert.Equal(t, 30*time.Minute, res.Delay)
	require.ErrorIs(t, res.HandlerErr, errStock, "errors.Is sees through the route")

	msg := sampleMessage()
	msg.Subject = strPtr("refunds")
	f2 := newFixture(t, r.Handle, opts)
	f2.broker.Send(msg)
	res = f2.process()
	assert.Equal(t, "global stock", res.Policy, "a route without rules falls back to the Options'")
	assert.Equal(t, time.Minute, res.Delay)
}

func TestRouterDeadLettersWhatNoRouteTakes(t *testing.T) {
	r, err := retry.NewRouter([]retry.Route{{Match: retry.Subject("payments"), Handler: okHandler}}, nil)
	require.NoError(t, err)
	f := newFixture(t, r.Handle, &retry.Options{ImmediateRetries: 3})
	f.broker.Send(sampleMessage())
	res := f.process()
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Equal(t, "RetryNoRoute", res.DeadLetterReason)
	assert.Zero(t, res.ImmediateRetries)
	dl := f.broker.DeadLettered()
	require.Len(t, dl, 1)
	assert.Contains(t, dl[0].Description, `no route for the message (subject "orders")`)
}

func TestRouterFallback(t *testing.T) {
	called := false
	r, err := retry.NewRouter([]retry.Route{{Match: retry.Subject("payments"), Handler: okHandler}},
		&retry.RouterOptions{Fallback: retry.Route{Handler: func(context.Context, *azservicebus.ReceivedMessage) error {
			called = true
			return nil
		}}})
	require.NoError(t, err)
	f := newFixture(t, r.Handle, nil)
	f.broker.Send(sampleMessage())
	assert.Equal(t, retry.OutcomeCompleted, f.process().Outcome)
	assert.True(t, called)
}

func TestRouterMatcherThatPanicsDoesNotMatch(t *testing.T) {
	r, err := retry.NewRouter([]retry.Route{
		{Match: func(m *azservicebus.ReceivedMessage) bool { return m.ApplicationProperties["n"].(string) == "x" }, Handler: okHandler},
	}, nil)
	require.NoError(t, err)
	err = r.Handle(t.Context(), &azservicebus.ReceivedMessage{ApplicationProperties: map[string]any{"n": int64(1)}})
	require.ErrorIs(t, err, retry.ErrNoRoute)
}

func TestNewRouterRejectsBadRoutes(t *testing.T) {
	cases := []struct {
		name   string
		routes []retry.Route
		opts   *retry.RouterOptions
		field  string
	}{
		{"no route and no fallback", nil, nil, "routes"},
		{"empty routes and a fallback without handler", []retry.Route{}, &retry.RouterOptions{}, "routes"},
		{"no match", []retry.Route{{Handler: okHandler}}, nil, "routes[0].Match"},
		{"no handler", []retry.Route{{Match: retry.Subject("a")}}, nil, "routes[0].Handler"},
		{"bad rule", []retry.Route{{Match: retry.Subject("a"), Handler: okHandler, Policies: []retry.Rule{{}}}}, nil, "routes[0].Policies[0].Match"},
		{"bad fallback rule", nil, &retry.RouterOptions{Fallback: retry.Route{Handler: okHandler, Policies: []retry.Rule{{}}}}, "Fallback.Policies[0].Match"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := retry.NewRouter(tc.routes, tc.opts)
			var oe *retry.OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, tc.field, oe.Field)
			assert.ErrorIs(t, err, retry.ErrInvalidOptions)
		})
	}
	// A fallback alone is a router: every message goes to it.
	_, err := retry.NewRouter(nil, &retry.RouterOptions{Fallback: retry.Route{Handler: okHandler}})
	require.NoError(t, err)
}

// A middleware around the router that wraps its errors keeps the route's policies.
func TestRoutePoliciesSurviveAWrappingMiddleware(t *testing.T) {
	errStock := errors.New("out of stock")
	r, err := retry.NewRouter([]retry.Route{{Match: retry.Subject("orders"), Handler: failWith(errStock), Policies: []retry.Rule{
		{Name: "stock", Match: retry.ErrorIs(errStock), Policy: retry.Policy{Action: retry.ActionDiscard}},
	}}}, nil)
	require.NoError(t, err)
	wrap := func(next retry.Handler) retry.Handler {
		return func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			if err := next(ctx, m); err != nil {
				return errors.Join(errors.New("audit"), fmt.Errorf("handling: %w", err))
			}
			return nil
		}
	}
	f := newFixture(t, retry.Chain(r.Handle, wrap), nil)
	f.broker.Send(sampleMessage())
	res := f.process()
	assert.Equal(t, retry.OutcomeDiscarded, res.Outcome)
	assert.Equal(t, "stock", res.Policy)
}
