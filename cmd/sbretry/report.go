package main

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
	"github.com/sbretry/retry/internal/redact"
)

// confirmWord is the exact answer a destructive command asks for: anything else, "y" and "YES"
// included, and end of input (a script that forgot --yes) is a no.
const confirmWord = "yes"

// confirm asks question on stderr and reads one line from stdin; an answer other than confirmWord
// returns an error saying that nothing was done.
func (a *app) confirm(question, what string) error {
	fmt.Fprintf(a.stderr, "%s Type %s to continue: ", question, confirmWord)
	line, _ := bufio.NewReader(a.stdin).ReadString('\n')
	if strings.TrimSpace(line) != confirmWord {
		return fmt.Errorf("%s not confirmed (the answer must be %q); nothing was done", what, confirmWord)
	}
	return nil
}

// report is the outcome of a command that acts on messages, as --json prints it.
type report interface {
	toJSON(err error) any
}

// finish ends a command that acts on messages: with --json it prints the report (also when err ends
// the command part way, so that a script sees what was done), else the summary line when there is no
// error. It returns err.
func (a *app) finish(asJSON bool, r report, err error, summary string) error {
	if asJSON {
		if werr := writeJSON(a.stdout, r.toJSON(err)); werr != nil && err == nil {
			return werr
		}
		return err
	}
	if err == nil && summary != "" {
		fmt.Fprintln(a.stdout, summary)
	}
	return err
}

// actionReport is a redrive or purge: the plan, what of it was done, and the refs asked for that were
// not there.
type actionReport struct {
	plan   *dlqaction.Plan
	dryRun bool
}

type jsonRef struct {
	Entity         string `json:"entity"`
	SequenceNumber int64  `json:"sequenceNumber"`
}

func refsJSON(refs []inspect.Ref) []jsonRef {
	out := make([]jsonRef, len(refs))
	for i, r := range refs {
		out[i] = jsonRef{Entity: r.Entity, SequenceNumber: r.SequenceNumber}
	}
	return out
}

type jsonPlanItem struct {
	jsonDeadLetter
	// ResubmitMessageID is the MessageID of the fresh delivery (redrive only).
	ResubmitMessageID string `json:"resubmitMessageId,omitempty"`
	// Sent says a redrive sent the fresh delivery (redrive only); done can still be false then, when
	// completing the dead letter failed.
	Sent *bool `json:"sent,omitempty"`
	Done bool  `json:"done"`
}

type jsonAction struct {
	Action   string         `json:"action"`
	DryRun   bool           `json:"dryRun"`
	Target   string         `json:"target,omitempty"`
	Selected int            `json:"selected"`
	Done     int            `json:"done"`
	Items    []jsonPlanItem `json:"items"`
	Missing  []jsonRef      `json:"missing"`
	Error    string         `json:"error,omitempty"`
}

func (r *actionReport) toJSON(err error) any {
	p := r.plan
	out := jsonAction{Action: string(p.Action), DryRun: r.dryRun, Target: p.Target, Selected: len(p.Items), Done: p.Done(),
		Items: make([]jsonPlanItem, len(p.Items)), Missing: refsJSON(p.Missing)}
	for i, it := range p.Items {
		out.Items[i] = jsonPlanItem{jsonDeadLetter: deadLetterJSON(it.DeadLetter), ResubmitMessageID: it.ResubmitID, Done: it.Done}
		if p.Action == dlqaction.Redrive {
			out.Items[i].Sent = &it.Sent
		}
	}
	if err != nil {
		out.Error = redact.String(err.Error())
	}
	return out
}

// errNothingFound is returned by status for a key that matched nothing anywhere it looked; it exits
// with exitNotFound.
var errNothingFound = errors.New("nothing found")
