#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ and runs each for a bounded time (seconds, default 10),
# failing on any crash, leak or timeout the fuzzer reports. Runs in .ci/run; longer campaigns are
# run by hand (fuzz/README.md).
#
# cargo-fuzz passes -Z flags to rustc; the pinned stable toolchain accepts them with
# RUSTC_BOOTSTRAP=1, so no nightly is needed. The fuzz crate is its own workspace with its own
# target dir (outside the clone, so CI machines build it incrementally). RUSTC_BOOTSTRAP is set
# for the fuzz build only: build scripts such as proc-macro2's rerun when it changes, so a cargo
# run in the workspace's target dir with it set would make the next CI run rebuild nearly every
# dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
workspace_target="${CARGO_TARGET_DIR:-/var/tmp/weir-target}"
export CARGO_TARGET_DIR="${WEIR_FUZZ_TARGET_DIR:-/var/tmp/weir-fuzz-target}"
targets=(request_frame record_batch weir_file records)

(cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz build)
bin_dir="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Seed request_frame with one valid frame per served (API, version): written by a unit test.
mkdir -p "$scratch/request_frame"
WEIR_FUZZ_SEED_DIR="$scratch/request_frame" CARGO_TARGET_DIR="$workspace_target" \
    env -u RUSTC_BOOTSTRAP cargo test -q -p weir-protocol --test request_decode test_write_fuzz_seed_corpus >/dev/null
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target" "$scratch/artifacts-$target"
    log="$scratch/$target.log"
    if ! "$bin_dir/$target" "$scratch/$target" -max_total_time="$seconds" -print_final_stats=1 \
            -artifact_prefix="$scratch/artifacts-$target/" >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz-smoke: $target FAILED (input saved under $scratch/artifacts-$target)" >&2
        trap - EXIT
        exit 1
    fi
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    echo "fuzz-smoke: $target ok, $runs executions in ${seconds}s"
done
