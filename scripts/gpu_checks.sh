#!/usr/bin/env bash
# Everything a GPU session checks and measures, in one call that fits the device tool's 10 minutes.
# The device machine is bare: NVIDIA's Vulkan driver needs glvnd's libraries, which this machine
# downloads once into .gl/ (git ignores it) and the script unpacks there:
#   echo /.gl/ >>.git/info/exclude; mkdir -p .gl /tmp/amd64/partial
#   o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
#   apt-get $o update && (cd .gl && apt-get $o download libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2)
# Without them vkCreateInstance fails with ErrorIncompatibleDriver (seen on an H200, driver 580:
# NVIDIA's ICD, libGLX_nvidia, loads glvnd's libEGL.so.1 and finds none). Where this machine has
# them (Debian's libegl1), copying the two libraries does instead (tried on an H200 too):
#   mkdir -p .gl && cp -L /usr/lib/x86_64-linux-gnu/libEGL.so.1 /usr/lib/x86_64-linux-gnu/libGLdispatch.so.0 .gl/
# Build here, pack the programs it runs, and run it there through ../shared/gpu:
#   cmake --build --preset default && ../shared/gpu/pack.sh build/default qkv bench/qkv_bench \
#     bench/qkv_graph_bench bench/qkv_decode_attention_bench bench/qkv_varlen_bench \
#     tests/qkv_backends_tests tests/qkv_train_tests tests/qkv_tools_tests
#   device run, carry [".gpu", ".gl"]:  bash .gpu/run.sh 'bash scripts/gpu_checks.sh'
# Parts (each under its own time limit; suite, khr and check side by side; at most 10 minutes in
# all, about 5 on an H200; logs in $OUT, or /tmp/qkv-gpu-logs without the tool):
#   devices   qkv devices, nvidia-smi
#   suite     every Vulkan test, validation layers on, sharded over the cores (a validation message
#             fails its test); the train and tools tests that run vulkan too
#   khr       the cooperative and half-precision tests with the kernels translated to
#             VK_KHR_cooperative_matrix (QKV_VULKAN_COOPERATIVE_MATRIX=khr; validation off: the
#             packed layer, Debian's 1.3.239, predates the extension)
#   check     qkv check all --backend vulkan --grad in f32, f16 and bf16
#   bench     attention rows timed by the device's timestamps, f16/bf16/f32 matmul rows at 4096^3
#             (matmul), then PyTorch CUDA's on the same GPU (../shared/gpu/torch_sdpa.py,
#             bench/torch_matmul.py)
#   serving   decode attention against caches of 4096 and 32768 (qkv_decode_attention_bench
#             --backend vulkan: kernels' device time against the copy bandwidth measured in the
#             same run) beside PyTorch's SDPA decode (bench/torch_decode_sdpa.py), and the varlen
#             batch (qkv_varlen_bench --backend vulkan)
#   sweep     the flash kernels' geometries (QKV_VULKAN_ATTENTION_GEOMETRY) at (1, 8, 4096, 64),
#             f32 forward and forward + backward, and the f16 rows with and without cooperative
#             matrices: what a GPU's defaults should be (docs/benchmarks.md, "On a GPU")
# QKV_GPU_PARTS picks parts (default: all, in that order); QKV_GPU_SHAPES the attention shapes.
# Tried end to end on lavapipe: QKV_GPU_PARTS=devices,check bash scripts/gpu_checks.sh
set -uo pipefail
out=${OUT:-/tmp/qkv-gpu-logs}
mkdir -p "$out"
rm -f "$out/.failed"
summary=$out/summary.txt
parts=${QKV_GPU_PARTS:-devices,suite,khr,check,bench,serving,sweep}
shapes=${QKV_GPU_SHAPES:-4,8,512,64;1,8,4096,64}
jobs=$(nproc)
((jobs > 12)) && jobs=12
root=$(pwd)
wanted() { [[ ",$parts," == *",$1,"* ]]; }

# part NAME SECONDS COMMAND...: runs COMMAND under a time limit into NAME.log, one summary line.
part() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" bash -o pipefail -c "$*" >"$out/$name.log" 2>&1
  local rc=$?
  ((rc == 0)) || echo "$name" >>"$out/.failed"
  echo "$name: exit $rc in $((SECONDS - t0)) s$( ((rc == 124 || rc == 137)) && echo ' (timed out)')" | tee -a "$summary"
}

# sharded BINARY FILTER: the tests of BINARY matching FILTER over $jobs processes; each shard's
# output, then the failures of all. Fails when a test failed or a shard did not end normally
# (a crash prints no FAILED line).
sharded() {
  local bin=$1 filter=$2 dir rc=0
  dir=$(mktemp -d)
  local pids=()
  for ((i = 0; i < jobs; i++)); do
    GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$i "$bin" --gtest_filter="$filter" >"$dir/$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    local status=0
    wait "${pids[$i]}" || status=$?
    ((status == 0)) || { rc=1; echo "== shard $i of $bin exited with $status"; }
  done
  cat "$dir"/*.log
  local failed
  failed=$(grep -h '^\[  FAILED  \] [A-Za-z]' "$dir"/*.log | sed 's/ (.*//; s/, where GetParam.*//' | sort -u)
  echo "== $bin, $jobs shards: $(cat "$dir"/*.log | grep -c '^\[       OK \]') passed, $(printf '%s' "$failed" | grep -c .) failed, $(cat "$dir"/*.log | grep -c '^\[  SKIPPED \]') skipped"
  [ -n "$failed" ] && echo "$failed"
  [ -z "$failed" ] && ((rc == 0))
}
export -f sharded
export jobs

echo "qkv gpu checks: $(date -u +%FT%TZ), $(nproc) cores, parts $parts" >"$summary"
if compgen -G ".gl/*.deb" >/dev/null && ! ldconfig -p | grep -q libGLdispatch; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
elif [ -f .gl/libEGL.so.1 ]; then  # the libraries copied from this machine, and glvnd's vendor file for NVIDIA's EGL
  export LD_LIBRARY_PATH=$root/.gl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo '{"file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_nvidia.so.0"}}' >/tmp/10_nvidia.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/tmp/10_nvidia.json
fi
# The tools tests run the qkv program at the path it was built at.
if src=$(cat /tmp/qkv-gpu/src_path 2>/dev/null) && [ ! -x "$src/build/default/qkv" ] && command -v qkv >/dev/null; then
  mkdir -p "$src/build/default" && ln -sf "$(command -v qkv)" "$src/build/default/qkv"
fi
wanted devices && part devices 30 'qkv devices && { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true; }'
# The suite, the KHR tests and the checks compile shaders on the CPUs: side by side.
wanted suite && part suite 270 "jobs=$((jobs * 2 / 3)) sharded qkv_backends_tests '*Vulkan*:*vulkan*:*Cooperative*'; r=\$?; \
    qkv_train_tests --gtest_filter='*vulkan*:*Vulkan*'; t=\$?; qkv_tools_tests --gtest_filter='*vulkan*:*Vulkan*'; exit \$((r | t | \$?))" &
wanted khr && part khr 270 "QKV_VULKAN_COOPERATIVE_MATRIX=khr QKV_VULKAN_VALIDATION=0 jobs=3 sharded qkv_backends_tests \
    'CooperativeMatrix*:HalfPrecision*/vulkan:HalfPrecisionVulkan.*:Torch.Half*/vulkan:VulkanFeatures.*'" &
wanted check && part check 270 'for t in f32 f16 bf16; do (qkv check all --backend vulkan --grad --dtype $t >/tmp/check_$t.log 2>&1; echo "== --dtype $t: exit $?" >>/tmp/check_$t.log) & done; wait; \
    cat /tmp/check_*.log; ! grep -q "exit [1-9]" /tmp/check_*.log' &
wait
if wanted bench || wanted sweep; then  # a second of work first, so that the GPU's clocks have risen before a row is timed
  QKV_BENCH_DEVICE_TIME=1 QKV_BENCH_SHAPES=1,8,4096,64 QKV_BENCH_BACKENDS=vulkan timeout 30 qkv_bench --benchmark_filter='^vulkan/' \
    --benchmark_min_time=1 >/dev/null 2>&1
fi
if wanted bench; then
  part bench 120 "QKV_BENCH_DEVICE_TIME=1 QKV_BENCH_SHAPES='$shapes' QKV_BENCH_BACKENDS=vulkan qkv_bench --benchmark_filter='^vulkan' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_min_time=0.1 --benchmark_color=false"
  part matmul 60 "QKV_BENCH_MATMUL=4096,4096,4096 QKV_BENCH_BACKENDS=vulkan qkv_graph_bench --benchmark_filter='^vulkan.*matmul' \
    --benchmark_min_time=0.1 --benchmark_color=false"
  part torch 60 "python3 $root/.gpu/torch_sdpa.py ${shapes//;/ } && python3 $root/bench/torch_matmul.py 4096,4096,4096"
fi
if wanted serving; then
  part decode 90 "qkv_decode_attention_bench --backend vulkan --repeat 5 && python3 $root/bench/torch_decode_sdpa.py"
  part varlen 40 "qkv_varlen_bench --backend vulkan --repeat 5"
fi
if wanted sweep; then
  # The flash kernels' geometries on this GPU, each after the GPU has been busy (a first row after
  # seconds of idle ran at half speed on an H200), and f16 with and without cooperative matrices.
  part sweep 150 "rc=0; for geo in default 128,1,32 128,1,64 256,1,32 256,1,16 64,1,32 128,2,32 128,1,16; do \
      e=; [ \$geo = default ] || e=QKV_VULKAN_ATTENTION_GEOMETRY=\$geo; echo \"== geometry \$geo\"; \
      env \$e QKV_BENCH_DEVICE_TIME=1 QKV_BENCH_SHAPES=1,8,4096,64 QKV_BENCH_BACKENDS=vulkan qkv_bench --benchmark_color=false \
        --benchmark_filter='^vulkan(-fwd\+bwd|-softcap)?/' --benchmark_min_time=0.3 | grep '^vulkan' || rc=1; done; \
    for c in auto 0; do echo \"== f16, QKV_VULKAN_COOPERATIVE_MATRIX=\$c\"; QKV_VULKAN_COOPERATIVE_MATRIX=\$c QKV_BENCH_DEVICE_TIME=1 \
      QKV_BENCH_SHAPES=1,8,4096,64 QKV_BENCH_BACKENDS=vulkan qkv_bench --benchmark_color=false \
      --benchmark_filter='^vulkan-(f16|fwd\+bwd-f16)/' --benchmark_min_time=0.3 | grep '^vulkan' || rc=1; done; exit \$rc"
fi
echo "logs in $out" | tee -a "$summary"
if [ -s "$out/.failed" ]; then
  echo "failed: $(tr '\n' ' ' <"$out/.failed")" | tee -a "$summary"
  rm -f "$out/.failed"
  exit 1
fi
