#!/usr/bin/env bash
# The NCCL 2.31-2.32 entry points side by side on one GPU: ffi-tests/gpu/api232.c run against
# oxccl (.device/lib) and NVIDIA's 2.32.3 (.device/ref, made by ../shared/tools/nccl-reference
# 2.32.3 90 .device/ref), one process per section so that a hang or crash costs one section,
# with 2 ranks on GPU 0 (and 1 rank where NVIDIA's refuses 2). Writes under $OUT (default
# /tmp/api232): <lib>-<ranks>-<section>.txt (CASE lines), .err (the library's WARN lines),
# dump-<lib>.txt (ncclParamDumpAll), and side-by-side.txt: each case's line from both; all
# of it also packed as api232.tar.gz (a device call brings few files back).
# usage: scripts/api232.sh [SECTIONS]   (letters of api232 -s; default "p m wr c a g e")
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/api232}
mkdir -p "$OUT" .device/ref/lib
[[ -f .device/ref/lib/libnccl.so.2 ]] || xz -dc .device/ref/libnccl-2.32.3.so.2.xz >.device/ref/lib/libnccl.so.2
export NCCL_NVLS_ENABLE=0 NCCL_MULTI_RANK_GPU_ENABLE=1
sections=${1:-"p m wr c a g e"}
for lib in nvidia ours; do
  dir=.device/lib
  [[ $lib == nvidia ]] && dir=.device/ref/lib
  for nr in 2 1; do
    for s in $sections; do
      f=$OUT/$lib-$nr-$s
      debug=WARN
      [[ $s == g ]] && debug=INFO
      limit=${API232_TIMEOUT:-45}
      # NVIDIA's grown communicator of 4 ranks in one process on one GPU does not finish its
      # first all-reduce (its CTAs of 4 ranks are not all resident): that case is bounded short.
      [[ $lib == nvidia && $nr == 2 && $s == g ]] && limit=20
      LD_LIBRARY_PATH=$dir NCCL_DEBUG=$debug timeout -k 5 "$limit" .device/bin/api232 -n "$nr" -s "$s" \
        -d "$OUT/dump-$lib.txt" >"$f.txt" 2>"$f.err"
      echo "rc=$? $lib ranks=$nr section=$s: $(grep -c '^CASE' "$f.txt") cases" | tee -a "$OUT/runs.txt"
    done
  done
done
# Side by side (2 ranks): each case name once, our line then NVIDIA's.
for s in $sections; do
  paste -d'\n' <(sed 's/^/ours   /' "$OUT/ours-2-$s.txt") <(sed 's/^/nvidia /' "$OUT/nvidia-2-$s.txt")
done >"$OUT/side-by-side.txt"
tar -czf "$OUT.tar.gz" -C "$OUT" . && mv "$OUT.tar.gz" "$OUT/api232.tar.gz"
