# Targets used by developers and CI. `make test` is the command README.md and .ci/run call.
GO ?= go
PKGS := ./...
FUZZTIME ?= 10s

.PHONY: test vet fmt-check fuzz bench quickstart soak soak-short

test: vet fmt-check
	$(GO) test -race -shuffle=on -count=1 $(PKGS)

vet:
	$(GO) vet $(PKGS)

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

bench:
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
