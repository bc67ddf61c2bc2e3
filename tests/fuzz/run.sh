#!/usr/bin/env bash
# Runs a libFuzzer target for a bounded time: run.sh TARGET SEEDS WORK SECONDS [DICT]. New inputs go
# to WORK (in the build tree), the seeds stay as they are; DICT, when given, is a libFuzzer
# dictionary of the format's tokens (nesting brackets, field names). A target may add seeds of its
# own to WORK ($WEFT_FUZZ_SEED_DIR). Prints the executions run. Fails on any crash, sanitizer
# report, leak or timeout the target reports.
set -euo pipefail
target=$1 seeds=$2 work=$3 seconds=$4 dict=${5:-}
mkdir -p "$work"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
extra=()
[ -n "$dict" ] && extra+=(-dict="$dict")
if ! WEFT_FUZZ_SEED_DIR="$work" "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/" "${extra[@]}" "$work" "$seeds" >"$log" 2>&1; then
  tail -40 "$log"
  exit 1
fi
grep -E "stat::number_of_executed_units|cov:" "$log" | tail -2
