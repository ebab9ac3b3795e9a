# Weir: `make run` starts a single-node agent on ./data; `make test` runs every test.
CARGO_TARGET_DIR ?= /var/tmp/weir-target
export CARGO_TARGET_DIR

.PHONY: run build test test-unit test-e2e sim lint fmt

# More simulation seeds than `make test` runs: make sim SEEDS=1000 START=40
SEEDS ?= 200
START ?= 40

run:
	cargo run --release -p weir -- agent

build:
	cargo build -p weir

test: test-unit test-e2e

test-unit: build
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
