// Package ledger is what the soak's consumer process and its driver agree on: the classes of handler
// behaviour a message carries ([Class]), the durable log the consumer appends to (one line per success,
// processed delivery and failed settle; [Writer], [Parse], [Tail]) and the set arithmetic over message
// ids that decides whether a run lost, forked or needlessly repeated anything ([Check]).
package ledger
