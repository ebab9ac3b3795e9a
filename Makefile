# Weir: `make run` starts a single-node agent on ./data; `make test` runs every test.
CARGO_TARGET_DIR ?= /var/tmp/weir-target
export CARGO_TARGET_DIR

.PHONY: run build test test-unit test-e2e sim lint fmt fuzz-smoke mutants soak

# More simulation seeds than `make test` runs: make sim SEEDS=1000 START=40
SEEDS ?= 200
START ?= 40

# MALLOC_ARENA_MAX=2: glibc's per-thread arenas otherwise keep freed memory, and the agent's RSS
# grows long after its live heap has levelled off (docs/benchmarks.md §10, docs/operations.md).
run:
	MALLOC_ARENA_MAX=$${MALLOC_ARENA_MAX:-2} cargo run --release -p weir -- agent

build:
	cargo build -p weir

# Both suites always run; the target fails if either failed, and says which.
test: build
	@unit=0; e2e=0; \
	$(MAKE) --no-print-directory test-unit || unit=$$?; \
	$(MAKE) --no-print-directory test-e2e || e2e=$$?; \
	echo "make test: unit tests $$( [ $$unit -eq 0 ] && echo passed || echo FAILED ), e2e tests $$( [ $$e2e -eq 0 ] && echo passed || echo FAILED )"; \
	[ $$unit -eq 0 ] && [ $$e2e -eq 0 ]

# tests/setup.sh installs the S3 and Azure servers the storage conformance suite starts.
test-unit: build
	tests/setup.sh
	cargo nextest run --workspace --no-fail-fast

test-e2e: build
	tests/setup.sh
	WEIR_BIN=$(CARGO_TARGET_DIR)/debug/weir .venv/bin/pytest tests/e2e

sim:
	cargo run --release -p weir-sim -- --start $(START) --seeds $(SEEDS)

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

fmt:
	cargo fmt --all

# Builds the fuzz targets (fuzz/, its own workspace and target dir) on the stable toolchain and
# runs each for FUZZ_SECONDS from the valid-frame seed corpus. Needs cargo-fuzz (.ci/run installs it).
FUZZ_SECONDS ?= 10
fuzz-smoke:
	tests/fuzz_smoke.sh $(FUZZ_SECONDS)

# Deliberately broken builds (tests/mutants/run.sh): each mutation must make weir-sim seeds fail.
# Outside CI: one release rebuild per mutation. make mutants SEEDS=30 START=0
mutants:
	tests/mutants/run.sh $(SEEDS) $(START)

# Bounded-state soak (not a test; prints a table for docs/benchmarks.md §10): retention, deletion
# and expiry under producer and group churn. make soak MINUTES=30
MINUTES ?= 30
soak:
	cargo build --release -p weir
	tests/setup.sh
	.venv/bin/python tests/soak/soak.py --weir $(CARGO_TARGET_DIR)/release/weir --minutes $(MINUTES)
