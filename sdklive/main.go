// Command sdklive runs the live test suite of the azservicebus SDK (the version in go.mod, taken with
// its tests from the module cache) against sbemu, one test at a time, and prints one line per test and
// "N/M passed" last. `make sdk-live` runs it.
//
// The SDK's own tests are the outside judge of the emulator: nobody here wrote them. They normally run
// against a real namespace; the runner changes only their harness, never a test body:
//
//   - harness.patch, applied to a temporary copy of the module, makes internal/test hand the tests a
//     fake token credential instead of Entra ID (the emulator checks shared access signatures as
//     Service Bus does and trusts JWTs: sbemu.Config.AcceptUnverifiedJWT);
//   - the endpoint and connection strings (SERVICEBUS_ENDPOINT, SERVICEBUS_CONNECTION_STRING and the
//     others the SDK's TestMain requires) name a loopback front door (frontdoor.go) that serves AMQP
//     and the administration API on one TLS port, as a namespace does on one host;
//   - SSL_CERT_FILE makes the test binaries trust the front door's throwaway CA.
//
// The live tests are the ones that skip in the SDK's playback mode (the harness skips every test that
// needs a namespace there): 119 in v1.11.0. Each runs in its own process against a fresh emulator with
// the queue "testQueue" that the SDK's test-resources.bicep creates, under -timeout. Everything is
// loopback; only building the test binaries may fetch the SDK's test dependencies through the Go
// module proxy.
//
//	go run ./sdklive                      # the whole suite
//	go run ./sdklive -run 'Sender|Admin'  # tests whose name matches
//	go run ./sdklive -results sdklive/RESULTS.md -keep
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// sdkModule is the module whose live tests the runner runs.
const sdkModule = "github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

// packages are the SDK packages that hold live tests, as paths inside the module.
var packages = []string{".", "admin", "internal"}

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "sdklive:", err)
		os.Exit(2)
	}
}

// options are the runner's flags.
type options struct {
	timeout  time.Duration
	parallel int
	filter   *regexp.Regexp
	results  string
	keep     bool
	patch    string
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("sdklive", flag.ContinueOnError)
	var (
		opts    options
		pattern = fs.String("run", "", "run only the live tests whose name matches this regular expression")
	)
	fs.DurationVar(&opts.timeout, "timeout", 90*time.Second, "time limit of each test")
	fs.IntVar(&opts.parallel, "parallel", 1, "tests run at once, each in its own process against its own emulator")
	fs.StringVar(&opts.results, "results", "", "also write the per-test results as a Markdown table to this file")
	fs.BoolVar(&opts.keep, "keep", false, "keep the working directory (SDK copy, binaries, per-test logs) and print its path")
	fs.StringVar(&opts.patch, "patch", "", "harness patch to apply (default sdklive/harness.patch: run from the repository root)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if opts.filter, err = regexp.Compile(*pattern); err != nil {
		return fmt.Errorf("-run: %w", err)
	}
	if opts.parallel < 1 {
		return fmt.Errorf("-parallel %d: must be at least 1", opts.parallel)
	}
	if opts.patch == "" {
		opts.patch = filepath.Join("sdklive", "harness.patch")
	}
	if opts.patch, err = filepath.Abs(opts.patch); err != nil {
		return err
	}

	work, err := os.MkdirTemp("", "sdklive-")
	if err != nil {
		return err
	}
	if opts.keep {
		fmt.Fprintln(stdout, "working directory:", work)
	} else {
		defer os.RemoveAll(work)
	}
	sdk, err := prepareSDK(ctx, work, opts.patch)
	if err != nil {
		return err
	}
	var all []testCase
	for _, pkg := range packages {
		bin := filepath.Join(work, "bin", strings.ReplaceAll(filepath.Join("sdk", pkg), string(filepath.Separator), "_")+".test")
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, "./"+pkg)
		cmd.Dir = sdk
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building the tests of %s: %w\n%s", pkg, err, out)
		}
		names, err := liveTests(ctx, bin, filepath.Join(sdk, pkg))
		if err != nil {
			return fmt.Errorf("listing the live tests of %s: %w", pkg, err)
		}
		for _, n := range names {
			all = append(all, testCase{pkg: pkg, name: n, bin: bin, dir: filepath.Join(sdk, pkg)})
		}
	}
	total := len(all)
	logs := filepath.Join(work, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	var selected []testCase
	for _, tc := range all {
		if opts.filter.MatchString(tc.name) {
			selected = append(selected, tc)
		}
	}
	runTest := func(ctx context.Context, tc testCase) (result, error) { return runOne(ctx, tc, opts.timeout, logs) }
	results, err := runAll(ctx, selected, opts.parallel, runTest, func(r result) {
		fmt.Fprintf(stdout, "%s %-8s %s (%.1fs)%s\n", r.status, pkgLabel(r.tc.pkg), r.tc.name, r.elapsed.Seconds(), reasonSuffix(r.reason))
	})
	if err != nil {
		return err
	}
	passed, ran := 0, len(results)
	for _, r := range results {
		if r.status == "PASS" {
			passed++
		}
	}
	if ran != total {
		fmt.Fprintf(stdout, "%d/%d passed (%d of %d live tests selected by -run)\n", passed, ran, ran, total)
	} else {
		fmt.Fprintf(stdout, "%d/%d passed\n", passed, total)
	}
	if opts.results != "" {
		return writeResults(opts.results, results, passed, ran, opts.parallel)
	}
	return nil
}

// pkgLabel names an SDK package in the output.
func pkgLabel(pkg string) string {
	if pkg == "." {
		return "root"
	}
	return pkg
}

func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

// prepareSDK copies the SDK module from the module cache into work/sdk and applies the harness patch.
func prepareSDK(ctx context.Context, work, patch string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", sdkModule).Output()
	if err != nil {
		return "", fmt.Errorf("finding %s in the module cache (run go mod download): %w", sdkModule, err)
	}
	src := strings.TrimSpace(string(out))
	if src == "" {
		return "", fmt.Errorf("%s is not in the module cache (run go mod download)", sdkModule)
	}
	dst := filepath.Join(work, "sdk")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		return "", fmt.Errorf("copying the SDK: %w", err)
	}
	apply := exec.CommandContext(ctx, "git", "apply", "--verbose", patch)
	apply.Dir = dst
	if out, err := apply.CombinedOutput(); err != nil {
		return "", fmt.Errorf("applying %s: %w\n%s", patch, err, out)
	}
	return dst, nil
}

// runAll runs the tests with run, parallel at a time, and reports each
// result to report in the order of tests (a result waits for those before
// it). It stops at the first error of the runner itself, after the tests
// under way have finished.
func runAll(ctx context.Context, tests []testCase, parallel int, run func(context.Context, testCase) (result, error), report func(result)) ([]result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type done struct {
		i   int
		r   result
		err error
	}
	jobs := make(chan int)
	out := make(chan done)
	var wg sync.WaitGroup
	for range min(parallel, max(len(tests), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if ctx.Err() != nil {
					// The feeder may still hand out a job as the run is cancelled (its select
					// picks at random between the send and the cancellation): never start it.
					continue
				}
				r, err := run(ctx, tests[i])
				if err == nil {
					err = ctx.Err() // a test killed by the cancellation is not a result
				}
				out <- done{i: i, r: r, err: err}
			}
		}()
	}
	go func() {
		defer close(jobs)
		for i := range tests {
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		wg.Wait()
		close(out)
	}()
	results := make([]result, len(tests))
	finished := make([]bool, len(tests))
	next := 0
	var firstErr error
	for d := range out {
		if d.err != nil {
			if firstErr == nil {
				firstErr = d.err
				cancel()
			}
			continue
		}
		results[d.i], finished[d.i] = d.r, true
		for next < len(tests) && finished[next] {
			report(results[next])
			next++
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return results, nil
}

// testCase is one live test of one SDK package.
type testCase struct {
	pkg, name string
	bin, dir  string // the package's test binary and directory
}

// topSkip matches a top-level test's skip line in -test.v output.
var topSkip = regexp.MustCompile(`^--- SKIP: (\S+)`)

// liveTests lists the live tests of a test binary: the top-level tests that skip in the SDK's playback
// mode, where its harness skips every test that needs a namespace. The unit tests run (and pass or
// fail) on the way; their results do not matter here.
func liveTests(ctx context.Context, bin, dir string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.v", "-test.count=1", "-test.timeout=9m")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "AZURE_RECORD_MODE=playback")
	out, _ := cmd.Output() // a failing unit test does not hide the skips
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := topSkip.FindStringSubmatch(sc.Text()); m != nil {
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		return nil, errors.New("no test skipped in playback mode")
	}
	return names, nil
}

// result is the outcome of one test.
type result struct {
	tc      testCase
	status  string // PASS, FAIL or SKIP
	reason  string // why it failed or skipped, one line
	elapsed time.Duration
}

// runOne runs one test in its own process against a fresh emulator behind a fresh front door, and
// keeps its output in logs.
func runOne(ctx context.Context, tc testCase, timeout time.Duration, logs string) (result, error) {
	base := filepath.Join(logs, pkgLabel(tc.pkg)+"."+tc.name)
	emuLog, err := os.Create(base + ".sbemu.log")
	if err != nil {
		return result{}, err
	}
	defer emuLog.Close()
	em, err := sbemu.Start(sbemu.Config{
		Queues: []broker.QueueConfig{{Name: "testQueue"}},
		Logger: slog.New(slog.NewTextHandler(emuLog, &slog.HandlerOptions{Level: slog.LevelInfo})),
		// Service Bus keeps a closed connection's locks, which
		// TestMessageSettlementUsingOnlyBackupSettlement relies on; the emulator's default does not
		// (see Config.KeepLocksOnDisconnect).
		KeepLocksOnDisconnect: true,
		// Tokens are checked as Service Bus checks them, so the tests of rights and expired tokens see
		// the service's refusals; the SDK's fake token credential (harness.patch) cannot be verified and
		// is trusted instead.
		StrictAuth:          true,
		AcceptUnverifiedJWT: true,
		AuthorizationRules:  reducedRightsRules(),
	})
	if err != nil {
		return result{}, err
	}
	defer em.Close()
	door, caPEM, err := newFrontDoor(em.Addr().String(), em.AdminEndpoint(), em.AdminHTTPClient().Transport)
	if err != nil {
		return result{}, err
	}
	defer door.Close()
	caPath := base + ".ca.pem"
	if err := os.WriteFile(caPath, caPEM, 0o600); err != nil {
		return result{}, err
	}

	cmdCtx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cmdCtx, tc.bin, "-test.run", "^"+regexp.QuoteMeta(tc.name)+"$", "-test.v", "-test.count=1",
		"-test.timeout="+timeout.String())
	cmd.Dir = tc.dir
	cmd.Env = append(os.Environ(), environment(door.Addr(), caPath)...)
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, _ := cmd.CombinedOutput()
	elapsed := time.Since(start)
	if err := os.WriteFile(base+".log", out, 0o644); err != nil {
		return result{}, err
	}
	status, reason := verdict(tc.name, string(out))
	if cmdCtx.Err() != nil && status == "FAIL" && reason == "" {
		reason = "killed after " + (timeout + 30*time.Second).String()
	}
	return result{tc: tc, status: status, reason: reason, elapsed: elapsed}, nil
}

// The reduced-rights policies the SDK's test-resources.bicep gives its namespace, by the key names of
// the connection strings in environment.
const (
	keyListenAndSend = "ListenAndSend" // SERVICEBUS_CONNECTION_STRING_NO_MANAGE
	keySendOnly      = "SendOnly"
	keyListenOnly    = "ListenOnly"
)

// reducedRightsRules are the emulator's policies for the reduced-rights connection strings, all with
// the emulator's default key.
func reducedRightsRules() []sbemu.AuthorizationRule {
	return []sbemu.AuthorizationRule{
		{KeyName: keyListenAndSend, PrimaryKey: sbemu.DefaultKey, Rights: []sbemu.AccessRight{sbemu.RightListen, sbemu.RightSend}},
		{KeyName: keySendOnly, PrimaryKey: sbemu.DefaultKey, Rights: []sbemu.AccessRight{sbemu.RightSend}},
		{KeyName: keyListenOnly, PrimaryKey: sbemu.DefaultKey, Rights: []sbemu.AccessRight{sbemu.RightListen}},
	}
}

// environment is what the SDK's live tests read (internal/test/test_helpers.go and the TestMain of each
// package): the endpoint, the connection strings, and a CA to trust. The reduced-rights connection
// strings use key names of their own, which the emulator knows from reducedRightsRules.
func environment(endpoint, caPath string) []string {
	cs := func(keyName string) string {
		return "Endpoint=sb://" + endpoint + "/;SharedAccessKeyName=" + keyName + ";SharedAccessKey=" + sbemu.DefaultKey
	}
	return []string{
		"AZURE_RECORD_MODE=live",
		"SSL_CERT_FILE=" + caPath,
		"SERVICEBUS_ENDPOINT=" + endpoint,
		"SERVICEBUS_ENDPOINT_PREMIUM=" + endpoint,
		"SERVICEBUS_CONNECTION_STRING=" + cs(sbemu.DefaultKeyName),
		"SERVICEBUS_CONNECTION_STRING_PREMIUM=" + cs(sbemu.DefaultKeyName),
		"SERVICEBUS_CONNECTION_STRING_NO_MANAGE=" + cs(keyListenAndSend),
		"SERVICEBUS_CONNECTION_STRING_SEND_ONLY=" + cs(keySendOnly),
		"SERVICEBUS_CONNECTION_STRING_LISTEN_ONLY=" + cs(keyListenOnly),
	}
}
