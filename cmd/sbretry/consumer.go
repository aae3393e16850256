package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/sbretry/retry/console"
)

// envConsumerToken is the environment variable pause, resume and outage read the control token from.
const envConsumerToken = "SBRETRY_CONSUMER_TOKEN"

// consumerState is the outage breaker as a consumer's retry.ControlHandler answers it.
type consumerState struct {
	State        string    `json:"state"`
	Manual       bool      `json:"manual,omitempty"`
	Reason       string    `json:"reason,omitempty"`
	Since        time.Time `json:"since,omitzero"`
	NextProbe    time.Time `json:"next_probe,omitzero"`
	Trips        uint64    `json:"trips"`
	Probes       uint64    `json:"probes"`
	FailedProbes uint64    `json:"failed_probes"`
}

// consumerCommand runs pause, resume or outage against one consumer's control endpoint
// (retry.ControlHandler): a kill switch that acts on exactly the consumer named, previews in a dry run
// what it would change, and reports success only when the consumer answers the state asked for.
func (a *app) consumerCommand(ctx context.Context, name string, args []string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	endpoint := fs.String("consumer", "", "")
	reason := fs.String("reason", "", "")
	token := fs.String("token", "", "")
	dryRun := fs.Bool("dry-run", false, "")
	asJSON := fs.Bool("json", false, "")
	timeout := fs.Duration("timeout", 30*time.Second, "")
	var af auditFlags
	af.register(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("%s takes no arguments; name the consumer with --consumer URL", name)
	case *endpoint == "":
		return usagef("%s needs --consumer URL: the consumer's control endpoint (retry.ControlHandler)", name)
	case name != "pause" && *reason != "":
		return usagef("--reason is for pause")
	case name == "outage" && *dryRun:
		return usagef("outage only reads; --dry-run is for pause and resume")
	case name == "outage" && (af.file != "" || af.operator != ""):
		return usagef("outage only reads; --audit-file and --operator are for pause and resume")
	case *timeout <= 0:
		return usagef("--timeout must be positive")
	}
	u, err := url.Parse(*endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("--consumer %q: want an http or https URL", *endpoint)
	}
	if *token == "" {
		*token = a.getenv(envConsumerToken)
	}
	if *token != "" && u.Scheme == "http" && !isLoopback(u.Hostname()) {
		return usagef("--consumer %s: a token is sent only over https, or over http to a loopback address", u.Redacted())
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	cl := &consumerClient{url: u.String(), token: *token}

	before, err := cl.do(ctx, http.MethodGet, nil)
	if err != nil {
		return err
	}
	if name == "outage" {
		return a.printConsumer(*asJSON, u, "", before, nil)
	}
	want := map[string]string{"pause": "open", "resume": "closed"}[name]
	if *dryRun {
		return a.printConsumer(*asJSON, u, "would "+name, before, nil)
	}
	body := map[string]string{"action": name}
	if *reason != "" {
		body["reason"] = *reason
	}
	// The record names the consumer by its URL without credentials; the token is never written.
	au := a.newAuditor(&af, name)
	au.selection(u.Redacted(), nil)
	item := func(done bool) []console.AuditItem {
		return []console.AuditItem{{Ref: "consumer " + u.Redacted(), Done: done}}
	}
	if err := au.start(item(false)); err != nil {
		return err
	}
	after, err := cl.do(ctx, http.MethodPost, body)
	if err == nil && (after.State != want || (name == "pause" && !after.Manual)) {
		err = fmt.Errorf("%s: the consumer answered state %q after %s (want %q): not done", u.Redacted(), after.State, name, want)
	}
	done := 0
	if err == nil {
		done = 1
	}
	if err := au.end(done, err, item(done == 1)); err != nil {
		return err
	}
	return a.printConsumer(*asJSON, u, name+"d", before, &after)
}

// printConsumer prints what a command found (before) and, for a change, what the consumer answered.
func (a *app) printConsumer(asJSON bool, u *url.URL, action string, before consumerState, after *consumerState) error {
	if asJSON {
		out := struct {
			Consumer string         `json:"consumer"`
			Action   string         `json:"action,omitempty"`
			Before   consumerState  `json:"before"`
			After    *consumerState `json:"after,omitempty"`
		}{u.Redacted(), action, before, after}
		return writeJSON(a.stdout, out)
	}
	line := func(prefix string, s consumerState) {
		fmt.Fprintf(a.stdout, "%s%s: outage breaker %s", prefix, u.Redacted(), s.State)
		if s.Manual {
			fmt.Fprint(a.stdout, " (paused by hand)")
		}
		if s.Reason != "" {
			fmt.Fprintf(a.stdout, ": %s", s.Reason)
		}
		if !s.NextProbe.IsZero() {
			fmt.Fprintf(a.stdout, "; next probe %s", s.NextProbe.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(a.stdout, " (trips %d, probes %d, failed %d)\n", s.Trips, s.Probes, s.FailedProbes)
	}
	switch {
	case action == "":
		line("", before)
	case after == nil:
		line(action+" ", before)
	default:
		line("before: ", before)
		line(action+": ", *after)
	}
	return nil
}

// controlClient follows no redirect: a redirect could carry the token to plain http, or the action to
// another endpoint than the one named. A redirect's answer is reported as a refusal.
var controlClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// consumerClient talks to one control endpoint.
type consumerClient struct {
	url, token string
}

// errConsumerRefused is a control endpoint's refusal (its JSON error), or an answer that is not one.
var errConsumerRefused = errors.New("the consumer refused")

func (c *consumerClient) do(ctx context.Context, method string, body any) (consumerState, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return consumerState{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url, rd)
	if err != nil {
		return consumerState{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	// Who asked, for the consumer's log of pauses and resumes: the local user, as the operator's
	// shell names them (caller-supplied, so a record, not an authentication).
	if u := os.Getenv("USER"); u != "" {
		req.Header.Set("X-Sbretry-Operator", u)
	}
	resp, err := controlClient.Do(req)
	if err != nil {
		return consumerState{}, fmt.Errorf("reaching the consumer: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return consumerState{}, fmt.Errorf("reading the consumer's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		if e.Error == "" {
			e.Error = "no explanation"
		}
		return consumerState{}, fmt.Errorf("%w (%s): %s", errConsumerRefused, resp.Status, clip(e.Error, 200))
	}
	var st consumerState
	if err := json.Unmarshal(data, &st); err != nil || st.State == "" {
		return consumerState{}, fmt.Errorf("%w: the answer is not a consumer's control state; is --consumer its ControlHandler?", errConsumerRefused)
	}
	return st, nil
}

// isLoopback reports whether host is localhost or a loopback address.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
