package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sbretry/retry/inspect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	const cs = "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=x;UseDevelopmentEmulator=true"
	q := []string{"--connection-string", cs, "--queue", "orders"}
	sub := []string{"--connection-string", cs, "--topic", "events", "--subscription", "billing"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "no command"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"dlq without subcommand", append(q, "dlq"), "dlq needs a subcommand"},
		{"status without key", append(q, "status"), "status needs exactly one KEY"},
		{"status with two keys", append(q, "status", "a", "b"), "status needs exactly one KEY"},
		{"no entity", []string{"--connection-string", cs, "status", "k"}, "no entity"},
		{"queue and topic", append(q, "--topic", "t", "--subscription", "s", "status", "k"), "not both"},
		{"topic alone", []string{"--connection-string", cs, "--topic", "t", "status", "k"}, "go together"},
		{"no connection string", []string{"--queue", "orders", "status", "k"}, "no connection string"},
		{"unknown flag", append(q, "status", "k", "--frob"), "flag provided but not defined"},
		{"redrive without selection", append(q, "dlq", "redrive"), "say which dead letters"},
		{"purge all and reason", append(q, "dlq", "purge", "--all", "--reason", "x"), "do not combine"},
		{"bad seq", append(q, "dlq", "redrive", "--seq", "1,x"), `"x" is not a sequence number`},
		{"bad limit", append(q, "pending", "--limit", "0"), "--limit must be positive"},
		{"bad max-peek", append(q, "status", "k", "--max-peek", "0"), "--max-peek must be positive"},
		{"dead-letter path as queue", []string{"--connection-string", cs, "--queue", "orders/$DeadLetterQueue", "status", "k"}, "name a queue"},
		{"show without seq", append(q, "dlq", "show"), "dlq show needs exactly one REF"},
		{"show with a bad ref", append(q, "dlq", "show", ":3"), `":3" is not a sequence number or ENTITY:SEQ`},
		{"cancel without ref", append(q, "cancel"), "cancel needs at least one REF"},
		{"bad ref in --seq", append(q, "dlq", "purge", "--seq", "orders/$DeadLetterQueue:x"), `is not a sequence number or ENTITY:SEQ`},
		// Never answer "nothing" for a place not looked at: a subscription's retries are in its retry queue.
		{"status of a subscription without its retry queue", append(sub, "status", "k"), "give --retry-queue QUEUE"},
		{"pending of a subscription without its retry queue", append(sub, "pending"), "give --retry-queue QUEUE"},
		{"dlq list of a subscription without its retry queue", append(sub, "dlq", "list"), "give --retry-queue QUEUE"},
		{"cancel on a subscription without its retry queue", append(sub, "cancel", "3"), "give --retry-queue QUEUE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := cliNoEntity(t, "", tc.args...)
			assert.Equal(t, exitUsage, code, errOut)
			assert.Contains(t, errOut, tc.want)
			assert.Contains(t, errOut, "usage: sbretry")
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"--help"}, {"status", "--help"}} {
		code, out, _ := cliNoEntity(t, "", args...)
		assert.Equal(t, exitOK, code)
		assert.Contains(t, out, "usage: sbretry")
	}
}

// TestRedriveFromSubscriptionNeedsQueue: the emulator serves no topics, but the refusal happens before
// any connection, so it is tested without one.
func TestRedriveFromSubscriptionNeedsQueue(t *testing.T) {
	t.Parallel()
	const cs = "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=x;UseDevelopmentEmulator=true"
	sub := []string{"--connection-string", cs, "--topic", "events", "--subscription", "billing", "dlq", "redrive", "--all"}

	code, _, errOut := cliNoEntity(t, "", sub...)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "give --redrive-to QUEUE")
	assert.Contains(t, errOut, "every subscription of the topic")

	code, _, errOut = cliNoEntity(t, "", append(sub, "--redrive-to", "EVENTS")...)
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "refusing to redrive to topic events")

	target, err := redriveTarget(mustEntity(t, "events/Subscriptions/billing"), "billing-retry")
	require.NoError(t, err)
	assert.Equal(t, "billing-retry", target)
	target, err = redriveTarget(mustEntity(t, "orders"), "")
	require.NoError(t, err)
	assert.Equal(t, "orders", target, "a queue's dead letters go back to the queue")
	_, err = redriveTarget(mustEntity(t, "orders"), "events/Subscriptions/billing")
	assert.Error(t, err)
}

// TestSecretsNeverPrinted: a malformed connection string, whose parser error would echo it, and a
// secret inside a dead letter's text, are redacted.
func TestSecretsNeverPrinted(t *testing.T) {
	const secret = "c2VjcmV0LWtleS12YWx1ZQ=="
	for _, cs := range []string{
		"Endpoint=nonsense;SharedAccessKeyName=k;SharedAccessKey=" + secret,
		"SharedAccessKey=" + secret,
	} {
		code, out, errOut := cliNoEntity(t, "", "--connection-string", cs, "--queue", "orders", "status", "k")
		assert.NotEqual(t, exitOK, code)
		assert.NotContains(t, out+errOut, secret)
	}
	// From the environment too.
	t.Setenv(envConnectionString, "Endpoint=nonsense;SharedAccessKey="+secret)
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"--queue", "orders", "status", "k"}, strings.NewReader(""), &out, &errOut)
	assert.Equal(t, exitError, code)
	assert.NotContains(t, out.String()+errOut.String(), secret)
	assert.Contains(t, errOut.String(), "sbretry: connection string:")
}

func TestParseWhen(t *testing.T) {
	t.Parallel()
	now := timeMust(t, "2026-12-01T10:00:00Z")
	got, err := parseWhen("2h", now)
	require.NoError(t, err)
	assert.Equal(t, timeMust(t, "2026-12-01T08:00:00Z"), got)
	got, err = parseWhen("2026-11-30T00:00:00+01:00", now)
	require.NoError(t, err)
	assert.True(t, got.Equal(timeMust(t, "2026-11-29T23:00:00Z")))
	for _, bad := range []string{"yesterday", "-2h"} {
		_, err := parseWhen(bad, now)
		assert.Error(t, err, bad)
	}
}

// TestStoppedActionsExitOne: an action that stopped part way exits 1 whatever its cause, even one that
// alone would mean "not found" or "usage": part of it may be done.
func TestStoppedActionsExitOne(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	a := &app{stderr: &errOut}
	assert.Equal(t, exitNotFound, a.exitCode(inspect.ErrNotFound))
	assert.Equal(t, exitError, a.exitCode(stopped(fmt.Errorf("cancel stopped after 1 of 2: %w", inspect.ErrNotFound))))
	assert.Equal(t, exitError, a.exitCode(stopped(inspect.ErrAmbiguousRef)))
	assert.Nil(t, stopped(nil))
}
