#!/usr/bin/env bash
# Builds the libFuzzer programs with clang and runs the targets side by side, each for SECONDS
# (default 60) under ASan + UBSan, starting from its committed corpus (tests/fuzz/corpus/TARGET)
# and the regression inputs (tests/fuzz/regressions/TARGET). New inputs go to a scratch folder, never into the tree.
# A crash fails the run and leaves the input in build/fuzz/crashes/; copy it to
# tests/fuzz/regressions/TARGET/ so that the ordinary tests replay it from then on.
#   tests/fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
seconds="${1:-60}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(npy safetensors ir_text)
build="$root/build/fuzz"
CXX=clang++ cmake -S "$root/tests/fuzz" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build"
mkdir -p "$build/crashes"
# The targets run side by side, one process each, each for SECONDS of wall time (on CI's two
# cores three targets share the CPU: each runs about two thirds of the inputs it would alone).
mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
for t in "${targets[@]}"; do mkdir -p "$build/corpus/$t" "$root/tests/fuzz/regressions/$t"; done
fuzz() {
  local t="$1"
  "$build/fuzz_$t" "$build/corpus/$t" "$root/tests/fuzz/corpus/$t" "$root/tests/fuzz/regressions/$t" \
    -dict="$root/tests/fuzz/$t.dict" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$build/crashes/$t-" -print_final_stats=1 2>"$build/$t.log"
}
declare -A pids
for t in "${targets[@]}"; do
  echo "== fuzzing $t for ${seconds}s"
  fuzz "$t" &
  pids[$t]=$!
done
status=0
for t in "${targets[@]}"; do
  if ! wait "${pids[$t]}"; then
    status=1
    echo "fuzz_$t FOUND A CRASH:"
    grep -E "ERROR|SUMMARY|property broken|Test unit written" "$build/$t.log" || tail -20 "$build/$t.log"
  fi
  grep -E "stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb" "$build/$t.log" | sed "s/^/  $t /" || true
done
exit $status
