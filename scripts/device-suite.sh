#!/usr/bin/env bash
# The GPU suite, run on the device machine from the repo root with .device/ carried
# (see scripts/stage-device). Writes logs under $OUT (default ./out) and prints a summary last.
# Usage: scripts/device-suite.sh [quick|full]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Every rank of these runs is on this machine: bootstrap and sockets over loopback only.
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
mode=${1:-full}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
ours=$PWD/.device/lib
nvidia=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
summary=()
note() { summary+=("$1"); echo "== $1"; }
run() { # name, timeout, command...
  local name=$1 t=$2; shift 2
  local start=$SECONDS
  timeout -k 5 "$t" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  note "$name: rc=$rc ($((SECONDS - start)) s) $(grep -E '[0-9]+ passed, [0-9]+ failed' "$OUT/$name.log" | tail -1)"
  tail -5 "$OUT/$name.log"
}
{
  nvidia-smi -L; nvidia-smi topo -m; echo "NVIDIA NCCL: $nvidia"
} >"$OUT/machine.log" 2>&1
note "GPUs: $ngpu; NVIDIA NCCL at ${nvidia:-not found}"
[ -x .device/bin/oxccl-kernel-check ] && run kernel-check 120 .device/bin/oxccl-kernel-check
for lib in nvidia ours; do
  dir=$([ $lib = ours ] && echo "$ours" || echo "$nvidia")
  [ -n "$dir" ] || continue
  run lifecycle-threads-$lib 180 env LD_LIBRARY_PATH="$dir" NCCL_DEBUG=WARN .device/bin/lifecycle -n "$ngpu"
  run lifecycle-procs-$lib 120 env LD_LIBRARY_PATH="$dir" NCCL_DEBUG=WARN .device/bin/lifecycle -n "$ngpu" -p
done
if [ -x .device/bin/oxccl-bench ] && [ -x scripts/gpu-suite.sh ] && [ "$mode" = full ]; then
  run gpu-suite 420 env OUT="$OUT" scripts/gpu-suite.sh --ours "$ours/libnccl.so.2" --bench .device/bin/oxccl-bench
fi
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
