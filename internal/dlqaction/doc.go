// Package dlqaction is the engine behind every operator action on dead letters and pending retries:
// the redrive, purge and cancel of cmd/sbretry and of the web console (package console).
//
// Every action goes through the same four steps, so that a front end cannot skip one:
//
//   - select: [Select] peeks the dead-letter queues of one [inspect.Inspector] and keeps what an
//     [inspect.DeadLetterFilter] selects; every item is addressed by an [inspect.Ref] (dead-letter queue
//     and sequence number), because Service Bus counts sequence numbers per entity;
//   - plan: [NewRedrivePlan] and [NewPurgePlan] turn a selection into a [Plan], the preview shown to the
//     operator: the refs and, for a redrive, the MessageID each fresh delivery will carry;
//   - execute: [Execute] receives each dead-letter queue of the plan in peek-lock mode and settles
//     exactly the planned dead letters in their own queue, refusing one that no longer matches its line
//     of the plan ([ErrChanged]) and abandoning every other message it meets on the way. A receive
//     asks for no more than the planned dead letters still to come, and the others are given back
//     only where no credit left on a link can take them again, so an action leaves nothing locked
//     for the next one;
//   - report: the plan's items carry Done, so a front end shows what was done also when the action
//     stopped part way; running the same action again finishes it.
//
// Cancelling pending retries follows the same shape with [PreviewCancel] and [Cancel].
//
// A redrive sends envelope.Resubmit and only then completes the dead letter: a crash between the two
// leaves the dead letter in place, and the re-run sends the same MessageID, which duplicate detection
// drops. The package never prints: warnings go to [Options.Warn], progress to [Options.Progress].
//
// Every broker call an action makes (receive, send, complete, abandon, and the inspector's peeks and
// cancels) is reported to the [inspect.Observer] of the inspector it was given, so a front end turns
// telemetry on in one place, [inspect.Options].Observer.
package dlqaction
