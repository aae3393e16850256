# Targets used by developers and CI. `make test` is the command README.md and .ci/run call.
GO ?= go
PKGS := ./...
FUZZTIME ?= 10s

.PHONY: test vet fmt-check sdk-live fuzz bench bench-paired bench-sessions bench-all quickstart soak soak-short soak-sessions soak-sessions-short

test: vet fmt-check
	$(GO) test -race -shuffle=on -count=1 $(PKGS)

# The live and repro suites run only by hand (against Azure, or to replay a soak finding), so vet
# builds them too: a helper moved out from under them otherwise goes unnoticed.
vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags live ./e2e/
	$(GO) vet -tags repro ./soak/repro/

fmt-check:
	@out=$$(gofmt -l . ); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Runs every native fuzz target briefly (FUZZTIME each).
fuzz:
	@set -e; for pkg in $$($(GO) list $(PKGS)); do \
	  for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$target"; \
	    $(GO) test -run='^$$' -fuzz="^$$target$$" -fuzztime=$(FUZZTIME) $$pkg; \
	  done; \
	done

# The side-by-side benchmarks of BENCHMARKS.md: each runs the library (impl=retry…) and a hand-written
# baseline (impl=loop) in the same run, COUNT times, into bench.txt; benchstat then prints them with one
# column per implementation, each compared with the loop. BenchmarkRetryLateness has no baseline and gets
# a table of its own. The e2e runs take a few minutes on two cores: follow them with `tail -f bench.txt`.
COUNT ?= 6
BENCHTIME ?= 5000x
BENCHSTAT ?= $(GO) run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
E2E_BENCHES := ^(BenchmarkConsume|BenchmarkConsumeWithFailures|BenchmarkConsumeIOBound|BenchmarkConsumeMemory|BenchmarkRetryLateness)$$

bench:
	@echo "writing bench.txt: COUNT=$(COUNT), BENCHTIME=$(BENCHTIME) for the e2e benchmarks"
	$(GO) test -run='^$$' -bench='^Benchmark(Process|ConsumerOverhead)$$' -benchmem -count=$(COUNT) . > bench.txt || { cat bench.txt; exit 1; }
	$(GO) test -run='^$$' -bench='$(E2E_BENCHES)' -benchtime=$(BENCHTIME) -count=$(COUNT) -timeout=60m ./e2e/ >> bench.txt || { cat bench.txt; exit 1; }
	$(BENCHSTAT) -col '/impl@(loop loop-slots loop-same-copy retry retry-no-renewal)' bench.txt
	$(BENCHSTAT) -filter '.name:RetryLateness' retry=bench.txt

# The end-to-end ratios of BENCHMARKS.md, made to hold on a noisy machine (BenchmarkPaired in
# e2e/bench_paired_test.go): one process keeps every implementation running on its own emulator and runs
# ROUNDS rounds of one burst of 5,000 messages each, adjacent and in rotating order, then reports the
# medians of the per-round ratios with their quartiles and 95 % intervals. One run's median moves between
# runs by more than its own interval says, so the benchmark runs RUNS times (each a process of its own,
# logging every round into bench-paired-N.txt) and e2e/poolpaired.py takes the median of all their rounds
# together, with its 95 % interval: the figures of BENCHMARKS.md. CASES picks the cases (a regexp:
# success|failures|iobound). About a minute per run and case on two cores.
RUNS ?= 3
ROUNDS ?= 40
CASES ?= success|failures|iobound
bench-paired:
	$(GO) test -c -o bench-e2e.test ./e2e/
	@rm -f bench-paired-*.txt; set -e; for i in $$(seq $(RUNS)); do \
	  (cd e2e && ../bench-e2e.test -test.run='^$$' -test.bench='^BenchmarkPaired$$/^case=($(CASES))$$' -test.benchtime=$(ROUNDS)x -test.timeout=60m -test.v) > bench-paired-$$i.txt; \
	  grep '^BenchmarkPaired/' bench-paired-$$i.txt | grep ns/op || true; echo "run $$i of $(RUNS)"; \
	done
	python3 e2e/poolpaired.py bench-paired-*.txt

# The session consumer's ratios (issue 18, BENCHMARKS.md "Session consumer"): BenchmarkPairedSessions
# in paired bursts against a hand-written session loop, RUNS runs of ROUNDS rounds pooled by
# e2e/poolsessions.py (SESSION_CASES: success, 200 sessions of 25; long, 40 of 125), then
# BenchmarkSessionHoldLateness three times.
SESSION_CASES ?= success|long
bench-sessions:
	$(GO) test -c -o bench-e2e.test ./e2e/
	@rm -f bench-sessions-*.txt; set -e; for i in $$(seq $(RUNS)); do \
	  (cd e2e && ../bench-e2e.test -test.run='^$$' -test.bench='^BenchmarkPairedSessions$$/^case=($(SESSION_CASES))$$' -test.benchtime=$(ROUNDS)x -test.timeout=60m -test.v) > bench-sessions-$$i.txt; \
	  grep '^BenchmarkPairedSessions/' bench-sessions-$$i.txt | grep ns/op || true; echo "run $$i of $(RUNS)"; \
	done
	python3 e2e/poolsessions.py bench-sessions-*.txt
	(cd e2e && ../bench-e2e.test -test.run='^$$' -test.bench='^BenchmarkSessionHoldLateness$$' -test.benchtime=2000x -test.count=3)

# Every benchmark of every package, once.
bench-all:
	$(GO) test -run='^$$' -bench=. -benchmem $(PKGS)

quickstart:
	$(GO) run ./examples/quickstart

# The standing soak (soak/README.md): a consumer process killed and restarted under network faults, then
# checked by set arithmetic over message ids. It prints its seed; SEED=n replays a run (0 picks one).
SEED ?= 0
# GO is passed on so that the driver builds the consumer with the same toolchain.
soak:
	GO=$(GO) $(GO) run ./soak/cmd/soak -seed $(SEED)

# The CI size of the soak: 1,000 messages, about 40 s.
soak-short:
	GO=$(GO) $(GO) run ./soak/cmd/soak -short -seed $(SEED)

# The sessions soak (soak/README.md, "Sessions"): retry.SessionConsumer on 200 sessions, 5,000 messages,
# under the same kills and faults, checked per session for order. About 1 m 45 s. SESSION_MODE=durable
# runs it with durable holds (SessionOptions.DurableHolds) instead of holds in place.
SESSION_MODE ?= inplace
soak-sessions:
	GO=$(GO) $(GO) run ./soak/cmd/soak -sessions 200 -session-mode $(SESSION_MODE) -seed $(SEED)

# Its CI size: 100 sessions, 600 messages, about 35 s; .ci/run runs it with SESSION_MODE=durable.
soak-sessions-short:
	GO=$(GO) $(GO) run ./soak/cmd/soak -short -sessions 100 -session-mode $(SESSION_MODE) -seed $(SEED)

# The azservicebus SDK's own live tests (119 in v1.11.0) against sbemu, one by one, with only their
# harness patched (sdklive/harness.patch): one line per test, then "N/119 passed". About nine minutes
# on two cores, which CI's ten-minute budget cannot take on top of `make test`, so it runs by hand
# (sdklive/README.md); it writes sdklive/RESULTS.md. SDKLIVE_FLAGS="-parallel 4" runs four at once.
SDKLIVE_FLAGS ?= -results sdklive/RESULTS.md
sdk-live:
	$(GO) run ./sdklive $(SDKLIVE_FLAGS)
