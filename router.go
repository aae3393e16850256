package retry

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"strconv"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// ErrNoRoute is wrapped by the error a [Router] returns for a message no route takes. The processor
// dead-letters such a message at once with DeadLetterReasons.NoRoute: retrying cannot give it a handler.
var ErrNoRoute = errors.New("retry: no route for the message")

// Matcher reports whether a [Route] takes a message. [Subject], [ContentType] and [envelope.Property] build the
// usual ones; any function will do, as long as it only reads the message.
type Matcher func(*azservicebus.ReceivedMessage) bool

// Subject matches the messages whose Subject (the AMQP subject, the SDK's "label" of old) is s, exactly.
func Subject(s string) Matcher {
	return func(m *azservicebus.ReceivedMessage) bool { return m.Subject != nil && *m.Subject == s }
}

// ContentType matches the messages whose content type has the media type of t, compared as RFC 2045
// says: without case and without parameters on either side, so ContentType("application/json") takes
// "Application/JSON; charset=utf-8". A message content type that does not parse matches nothing.
func ContentType(t string) Matcher {
	want, _, err := mime.ParseMediaType(t)
	if err != nil {
		want = strings.ToLower(strings.TrimSpace(t)) // matches nothing that parses, unless equal
	}
	return func(m *azservicebus.ReceivedMessage) bool {
		if m.ContentType == nil {
			return false
		}
		got, _, err := mime.ParseMediaType(*m.ContentType)
		return err == nil && got == want
	}
}

// Property matches the messages whose application property name equals value, of the same type: the
// SDK decodes AMQP integers by their width, so an int64 property must be given as an int64. Values are
// strings, booleans, integers or floats of any width; a value of another type matches nothing.
func Property(name string, value any) Matcher {
	return func(m *azservicebus.ReceivedMessage) bool {
		v, ok := m.ApplicationProperties[name]
		// sameType admits only comparable types, so == cannot panic on a []byte or a map.
		return ok && v != nil && sameType(v, value) && v == value
	}
}

// sameType reports whether a and b have the same dynamic type, among the ones Property accepts.
func sameType(a, b any) bool {
	switch a.(type) {
	case string:
		_, ok := b.(string)
		return ok
	case bool:
		_, ok := b.(bool)
		return ok
	case int64:
		_, ok := b.(int64)
		return ok
	case int32:
		_, ok := b.(int32)
		return ok
	case int16:
		_, ok := b.(int16)
		return ok
	case int8:
		_, ok := b.(int8)
		return ok
	case int:
		_, ok := b.(int)
		return ok
	case uint64:
		_, ok := b.(uint64)
		return ok
	case uint32:
		_, ok := b.(uint32)
		return ok
	case uint16:
		_, ok := b.(uint16)
		return ok
	case uint8:
		_, ok := b.(uint8)
		return ok
	case float64:
		_, ok := b.(float64)
		return ok
	case float32:
		_, ok := b.(float32)
		return ok
	}
	return false
}

// Route sends the messages its Match takes to its Handler, with its own failure policies.
type Route struct {
	// Name names the route in logs and errors. Empty means "route <index>".
	Name string
	// Match chooses the messages; it must not be nil. Routes are tried in order; the first that matches
	// takes the message.
	Match Matcher
	// Handler handles the route's messages; it must not be nil.
	Handler Handler
	// Policies are tried before Options.Policies for this route's failures (see [Policy]).
	Policies []Rule
}

// Router is a [Handler] that chooses the handler, and the failure policies, by message: by Subject,
// ContentType, an application property, or any [Matcher]. Pass its Handle method to [NewConsumer] or
// [NewProcessor]. A message no route takes fails with [ErrNoRoute] and is dead-lettered at once with
// DeadLetterReasons.NoRoute, unless Fallback is set. Create it with [NewRouter]; it is safe for
// concurrent use and read-only once built.
type Router struct {
	routes   []compiledRoute
	fallback *compiledRoute
}

type compiledRoute struct {
	name    string
	match   Matcher
	handler Handler
	rules   []Rule
}

// RouterOptions configures [NewRouter]. A nil *RouterOptions means no fallback.
type RouterOptions struct {
	// Fallback handles a message no route takes, with its Policies. A zero Fallback (nil Handler)
	// means none: such a message is dead-lettered with DeadLetterReasons.NoRoute.
	Fallback Route
}

// NewRouter returns a Router over routes, tried in order. A route without Match or Handler, or with an
// invalid rule, returns an error wrapping [ErrInvalidOptions], and so does a router with neither a
// route nor a fallback, which could only dead-letter every message.
func NewRouter(routes []Route, opts *RouterOptions) (*Router, error) {
	if len(routes) == 0 && (opts == nil || opts.Fallback.Handler == nil) {
		return nil, &OptionError{Field: "routes", Reason: "the router has no route and no fallback, so it would dead-letter every message"}
	}
	r := &Router{}
	for i, rt := range routes {
		field := "routes[" + strconv.Itoa(i) + "]"
		if rt.Match == nil {
			return nil, &OptionError{Field: field + ".Match", Reason: "must not be nil"}
		}
		c, err := compileRoute(field, rt, "route "+strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		r.routes = append(r.routes, c)
	}
	if opts != nil && opts.Fallback.Handler != nil {
		c, err := compileRoute("Fallback", opts.Fallback, "fallback")
		if err != nil {
			return nil, err
		}
		r.fallback = &c
	}
	return r, nil
}

func compileRoute(field string, rt Route, defName string) (compiledRoute, error) {
	if rt.Handler == nil {
		return compiledRoute{}, &OptionError{Field: field + ".Handler", Reason: "must not be nil"}
	}
	if err := validateRules(field+".Policies", rt.Policies); err != nil {
		return compiledRoute{}, err
	}
	name := rt.Name
	if name == "" {
		name = defName
	}
	return compiledRoute{name: name, match: rt.Match, handler: rt.Handler, rules: append([]Rule(nil), rt.Policies...)}, nil
}

// Handle runs the handler of the first route that takes msg. The error it returns carries the route,
// so the processor applies the route's policies; errors.Is and errors.As see through it. A Matcher
// that panics counts as not matching.
func (r *Router) Handle(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
	rt := r.pick(msg)
	if rt == nil {
		subject := ""
		if msg.Subject != nil {
			subject = *msg.Subject
		}
		return Permanent(fmt.Errorf("%w (subject %q)", ErrNoRoute, truncate(subject, 128)))
	}
	if err := rt.handler(ctx, msg); err != nil {
		return &routeError{err: err, route: rt}
	}
	return nil
}

// pick returns the route that takes msg, the fallback, or nil.
func (r *Router) pick(msg *azservicebus.ReceivedMessage) *compiledRoute {
	for i := range r.routes {
		if safeMatch(r.routes[i].match, msg) {
			return &r.routes[i]
		}
	}
	return r.fallback
}

// safeMatch calls m, treating a panic as no match: a Matcher reading a property of an unexpected
// shape must not crash the consumer.
func safeMatch(m Matcher, msg *azservicebus.ReceivedMessage) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return m(msg)
}

// routeError is a route handler's error, carrying the route for the processor's choice of policy.
type routeError struct {
	err   error
	route *compiledRoute
}

func (e *routeError) Error() string { return e.err.Error() }
func (e *routeError) Unwrap() error { return e.err }
