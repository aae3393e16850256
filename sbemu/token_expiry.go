package sbemu

import (
	"fmt"
	"time"
)

// Token expiry on live links, under [Config.StrictAuth].
//
// Service Bus checks a token not only when it is presented: when the token
// behind a link expires and the client has not put a fresh one on "$cbs"
// for the same audience, the service detaches the link with
// amqp:link:detach-forced and a description naming "Code: RenewToken"
// (as seen by SDK users, e.g. github.com/Azure/azure-sdk-for-python issue
// 23487 and github.com/dapr/components-contrib issue 809: "The link '...'
// is force detached. Code: RenewToken. Details: Unauthorized access...").
// The Go SDK treats detach-forced as a link error (azservicebus v1.11.0
// internal/errors.go, RecoveryKindLink): it re-creates the link, which
// puts a fresh token first, so a client whose credentials are still good
// recovers on its own, and one whose credentials are not fails with
// CodeUnauthorizedAccess at the new put-token.
//
// The emulator does the same on its own [Config.Clock], so a test moves a
// fake clock past a token's expiry instead of waiting hours. Without
// StrictAuth tokens are not checked at all, so nothing expires.

// watchTokenExpiry runs for the connection's lifetime under StrictAuth: it
// sleeps until the earliest token expiry, then detaches the links no
// unexpired token covers any more. A put-token wakes it to recompute.
func (c *conn) watchTokenExpiry() {
	defer c.wg.Done()
	clock := c.em.cfg.Clock
	for {
		var due <-chan time.Time
		if next, ok := c.nextTokenExpiry(); ok {
			d := next.Sub(clock.Now())
			if d <= 0 {
				// Also taken when the clock jumped past the expiry before this
				// goroutine asked for a timer: a fake clock that has already
				// moved on would never fire it.
				c.expireTokens()
				continue
			}
			due = clock.After(d)
		}
		select {
		case <-c.ctx.Done():
			return
		case <-c.authChanged:
		case <-due:
			c.expireTokens()
		}
	}
}

// nextTokenExpiry returns the earliest expiry of the connection's tokens.
func (c *conn) nextTokenExpiry() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for _, g := range c.authorized {
		if next.IsZero() || g.expiry.Before(next) {
			next = g.expiry
		}
	}
	return next, !next.IsZero()
}

// expireTokens forgets the tokens that have expired on the emulator's clock
// and force-detaches every link (other than "$cbs" itself) that no
// remaining token covers.
func (c *conn) expireTokens() {
	now := c.em.cfg.Clock.Now()
	expired := map[string]time.Time{}
	c.mu.Lock()
	for path, g := range c.authorized {
		if !now.Before(g.expiry) {
			expired[path] = g.expiry
			delete(c.authorized, path)
		}
	}
	c.mu.Unlock()
	if len(expired) == 0 {
		return
	}
	// c.mu is never held while a session's lock is taken (conn.go), so
	// the links are collected first and checked afterwards.
	var links []*link
	for _, s := range c.allSessions() {
		s.mu.Lock()
		for _, l := range s.links {
			if l.node != cbsNode {
				links = append(links, l)
			}
		}
		s.mu.Unlock()
	}
	for _, l := range links {
		if r, ok := c.rightsFor(l.path); ok && r.has(l.needs) {
			continue
		}
		l.forceDetach(condDetachForced, fmt.Sprintf(
			"sbemu: the link %q is force detached. Code: RenewToken. Details: the token for %q expired and was not renewed",
			l.name, l.path))
	}
	for path, expiry := range expired {
		c.log.Info("sbemu: token expired", "entity", path, "expiry", expiry)
	}
}
