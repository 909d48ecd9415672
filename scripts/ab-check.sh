#!/usr/bin/env bash
# A/B check of a refactor on one GPU: the new build against an old one, side by side in one
# run (oxccl-bench --lib NEW --vs OLD: the same sweep through each library in its own child
# processes, times A/B and #wrong of both), then the new build's correctness at shared ranks.
# Run from the repository root with .device/ staged (scripts/stage-device) and the old
# library at OLD (default .device/old/libnccl.so.2).
#
# usage: scripts/ab-check.sh [BUDGET_SECONDS]   (default 540); logs in ${OUT:-./out}/ab-*.log
# Steps, each under timeout within the budget (one that no longer fits is skipped):
#   1 one rank, every collective, float sum, 8 B .. 256 MiB x4, out of place, CUDA graphs
#   2 two ranks on GPU 0 (one process), the same
#   3 four ranks on GPU 0, all_reduce and all_gather, 8 B .. 64 MiB x4, CUDA graphs
#   4 new build only, --check 1: 2 ranks one process and 4 processes, every collective x
#     type x op, in and out of place, 0 B .. 1 MiB+4; 8 processes the same (#10's matrix)
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Every rank of these runs is on this machine: bootstrap and sockets over loopback only.
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
BUDGET=${1:-540}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
NEW=$PWD/.device/lib/libnccl.so.2
OLD=${OLD:-$PWD/.device/old/libnccl.so.2}
BENCH=$PWD/.device/bin/oxccl-bench
END=$((SECONDS + BUDGET))
FAILED=0
step() { # NAME LIMIT CMD...
  local name=$1 limit=$2 left=$((END - SECONDS - 5))
  shift 2
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then echo "SKIP $name (budget)"; return; fi
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$OUT/ab-$name.log" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || FAILED=1
  echo "$name: exit $rc after $((SECONDS - t0)) s; $(grep -E 'Wrong elements in total|WRONG' "$OUT/ab-$name.log" | head -3 | tr '\n' ' ')"
}
zeros() { local s=0 i; for ((i = 1; i < $1; i++)); do s="$s,0"; done; echo "$s"; }
multi=(env NCCL_MULTI_RANK_GPU_ENABLE=1)
ab=(--lib "$NEW" --vs "$OLD" -d float -o sum -b 8 -f 4 --inplace 0 --check 1 --graph -w 2 -n 10 --timeout 60)
step 1-one-rank 150 "$BENCH" "${ab[@]}" -g 1 -c all -e 256M
step 2-two-ranks 150 "${multi[@]}" "$BENCH" "${ab[@]}" --devices "$(zeros 2)" -c all -e 256M
step 3-four-ranks 100 "${multi[@]}" "$BENCH" "${ab[@]}" --devices "$(zeros 4)" -c all_reduce,all_gather -e 64M
full=(--lib "$NEW" -c all -d all -o all --inplace both --check 1 -w 0 -n 1 --timeout 30 --sizes 0,1,12,1028,65540,1048580)
step 4-matrix-r2 90 "${multi[@]}" "$BENCH" "${full[@]}" --devices "$(zeros 2)"
step 4-matrix-p4 90 "${multi[@]}" "$BENCH" "${full[@]}" -p 4 --ranks-per-gpu 4
step 4-matrix-p8 200 "${multi[@]}" "$BENCH" "${full[@]}" -p 8 --ranks-per-gpu 8
for f in "$OUT"/ab-[123]-*.log; do
  echo "== $(basename "$f")"
  awk '/^# Side-by-side summary/{on=1} on' "$f" | head -40
done
[ "$FAILED" = 0 ] && echo "ab-check: every step passed" || echo "ab-check: SOME STEPS FAILED"
