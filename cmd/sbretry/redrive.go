package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
)

// redriveTarget is the queue fresh deliveries go to: the queue itself, or --redrive-to (see
// dlqaction.Target). A target the command line must fix is a usage error.
func redriveTarget(e inspect.Entity, to string) (string, error) {
	if to != "" && strings.Contains(to, "/") {
		return "", usagef("--redrive-to %q must name a queue", to)
	}
	target, err := dlqaction.Target(e, to)
	if err != nil && to == "" {
		return "", usagef("%v", err)
	}
	return target, err
}

// dlqRedrive resubmits the selected dead letters as fresh first deliveries: for each, send
// envelope.Resubmit, then complete the dead letter in its own dead-letter queue (see the package
// documentation for why this order survives a crash). The dry run prints the plan the real run prints
// and carries out: the same dead letters, by entity and sequence number, and the same MessageIDs.
func (a *app) dlqRedrive(ctx context.Context, args []string) error {
	var c common
	var f filterFlags
	var af auditFlags
	fs := newFlagSet("dlq redrive", &c)
	f.register(fs, true)
	af.register(fs)
	dryRun := fs.Bool("dry-run", false, "")
	to := fs.String("redrive-to", "", "")
	ttl := fs.Duration("ttl", 0, "")
	wait := fs.Duration("wait", defaultReceiveWait, "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("dlq redrive takes no arguments, got %q", pos)
	}
	filter, err := f.filter(a.now(), true)
	if err != nil {
		return err
	}
	if *ttl < 0 || *wait <= 0 {
		return usagef("--ttl must not be negative and --wait must be positive")
	}
	e, err := c.entity()
	if err != nil {
		return err
	}
	target, err := redriveTarget(e, *to)
	if err != nil {
		return err
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	sel, err := a.selectDeadLetters(ctx, s, filter)
	if err != nil {
		return err
	}
	plan := dlqaction.NewRedrivePlan(sel, target, *ttl)
	rep := &actionReport{plan: plan, dryRun: *dryRun}
	if len(plan.Items) == 0 {
		return a.finish(c.json, rep, nil, fmt.Sprintf("nothing to redrive (read %s)", describeScans(sel.Scans)))
	}
	if !c.json {
		verb := "resubmitting"
		if *dryRun {
			verb = "would resubmit"
		}
		fmt.Fprintf(a.stdout, "%s %d dead letters to %s:\n", verb, len(plan.Items), target)
		if err := printPlan(a.stdout, plan); err != nil {
			return err
		}
	}
	if *dryRun {
		return a.finish(c.json, rep, nil, "")
	}
	// dlqaction sends each fresh delivery before it completes the dead letter: the crash contract of
	// the package documentation.
	au := a.newAuditor(&af, "redrive")
	au.selection(e.Path(), plan.Refs())
	if err := au.start(planAuditItems(plan)); err != nil {
		return a.finish(c.json, rep, err, "")
	}
	done, err := a.execute(ctx, s, plan, *wait)
	if err != nil {
		err = stopped(fmt.Errorf("redrive stopped after %d of %d: %w; run the same command again to finish", done, len(plan.Items), err))
	}
	err = au.end(done, err, planAuditItems(plan))
	return a.finish(c.json, rep, err, fmt.Sprintf("resubmitted %d dead letters to %s", done, target))
}
