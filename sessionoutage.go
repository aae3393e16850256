package retry

import "context"

// Outage mode on a session consumer (Options.Outage). The breaker is the queue consumer's (outage.go),
// fed the same way: asked before each handler call, told each attempt's outcome. While it is open no
// session is accepted (the workers wait in breaker.await), a session whose message is settled is
// released, and a message in hand waits in its session, its lock renewed and its attempt not spent,
// until the breaker lets it run, as the probe or once closed. That is the session's form of the queue
// consumer's held copy: a copy would break the session's order.

// breakerOpen reports whether the breaker is open (not half-open: a session accepted to probe with
// must deliver its message), so that a session whose message is settled is released rather than held
// idle.
func (r *sessionRun) breakerOpen() bool {
	return r.sc.stats.outage.holding()
}

// admitInPlace asks the outage breaker whether the handler may run now, waiting while it is open (or
// while another delivery probes), as it does while the consumer is paused, outage mode or not: the kill
// switch stops a retry in place too. ok is false when stop ended or the session lock was lost meanwhile.
func (r *sessionRun) admitInPlace(stop context.Context, hs *servedSession) (adm admission, ok bool) {
	b := r.sc.stats.outage
	if b.closed.Load() {
		return admission{kind: admitRun}, true
	}
	ctx, cancel := context.WithCancel(hs.lk.ctx)
	defer context.AfterFunc(stop, cancel)()
	defer cancel()
	for {
		adm, changed := b.admit()
		switch adm.kind {
		case admitRun, admitProbe:
			return adm, true
		case admitHold:
			if limit, _ := b.await(ctx, nil); limit == 0 {
				return adm, false
			}
		case admitWait:
			select {
			case <-changed:
			case <-ctx.Done():
				return adm, false
			}
		}
	}
}

// heldByBreaker tells the outage breaker what the attempt admitted as adm came to, and reports whether
// its failure is to be held in place: it counted, and the breaker is open now (it tripped on it, or the
// probe failed).
func (r *sessionRun) heldByBreaker(stop context.Context, hs *servedSession, adm admission, herr error) bool {
	if r.sc.cfg.outage == nil {
		return false
	}
	p := r.sc.proc
	out := attemptNone
	if lost, _ := hs.lk.lost(); !lost && !stopped(stop) {
		switch {
		case herr == nil:
			out = attemptSuccess
		case p.countsAsOutage(herr, p.cfg.policyFor(herr)):
			out = attemptFailure
		default:
			out = attemptNeutral
		}
	}
	open := r.sc.stats.outage.record(adm, out, herr)
	return out == attemptFailure && open
}
