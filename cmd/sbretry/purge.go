package main

import (
	"context"
	"fmt"

	"github.com/sbretry/retry/internal/dlqaction"
)

// dlqPurge deletes the selected dead letters, after the confirmation word unless --yes. It takes the
// same selection flags as a redrive and the same path through the dead-letter queues (peek to select,
// print the plan, peek-lock receive each queue, complete exactly the planned dead letters in their own
// queue, abandon the rest), with a complete as the only step: a purge interrupted part way is finished
// by running it again.
func (a *app) dlqPurge(ctx context.Context, args []string) error {
	var c common
	var f filterFlags
	var af auditFlags
	fs := newFlagSet("dlq purge", &c)
	f.register(fs, true)
	af.register(fs)
	dryRun := fs.Bool("dry-run", false, "")
	yes := fs.Bool("yes", false, "")
	wait := fs.Duration("wait", defaultReceiveWait, "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("dlq purge takes no arguments, got %q", pos)
	}
	filter, err := f.filter(a.now(), true)
	if err != nil {
		return err
	}
	if *wait <= 0 {
		return usagef("--wait must be positive")
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
	plan := dlqaction.NewPurgePlan(sel)
	rep := &actionReport{plan: plan, dryRun: *dryRun}
	if len(plan.Items) == 0 {
		return a.finish(c.json, rep, nil, fmt.Sprintf("nothing to purge (read %s)", describeScans(sel.Scans)))
	}
	if !c.json {
		verb := "deleting"
		if *dryRun {
			verb = "would delete"
		}
		fmt.Fprintf(a.stdout, "%s %d dead letters:\n", verb, len(plan.Items))
		if err := printPlan(a.stdout, plan); err != nil {
			return err
		}
	}
	if *dryRun {
		return a.finish(c.json, rep, nil, "")
	}
	au := a.newAuditor(&af, "purge")
	au.selection(s.entity.Path(), plan.Refs())
	// The count shown comes from the plan, so the operator confirms what will actually be deleted.
	if !*yes {
		if c.json {
			// stdout is the JSON; the operator confirms what stderr shows.
			fmt.Fprintf(a.stderr, "deleting %d dead letters:\n", len(plan.Items))
			if err := printPlan(a.stderr, plan); err != nil {
				return err
			}
		}
		if err := a.confirm(fmt.Sprintf("Delete the %d dead letters listed above for good?", len(plan.Items)), "purge"); err != nil {
			return a.finish(c.json, rep, au.refuse(err, planAuditItems(plan)), "")
		}
	}
	if err := au.start(planAuditItems(plan)); err != nil {
		return a.finish(c.json, rep, err, "")
	}
	done, err := a.execute(ctx, s, plan, *wait)
	if err != nil {
		err = stopped(fmt.Errorf("purge stopped after %d of %d: %w; run the same command again to finish", done, len(plan.Items), err))
	}
	err = au.end(done, err, planAuditItems(plan))
	return a.finish(c.json, rep, err, fmt.Sprintf("deleted %d dead letters", done))
}
