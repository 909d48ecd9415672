#!/usr/bin/env bash
# GPU suite for oxccl: the correctness matrix of oxccl-bench against a libnccl.so.2, then the
# side-by-side benchmark of ours against NVIDIA's NCCL. Run from the repository root on a GPU
# machine. See docs/bench-tool.md.
#
# usage: scripts/gpu-suite.sh [--quick] [--lib-only PATH] [--ours PATH] [--bench PATH]
#                             [--nvidia PATH] [--gpus N]
#   --lib-only PATH  run only the correctness matrix, against PATH (e.g. NVIDIA's library,
#                    to prove the tool itself)
#   --quick          a fast smoke run (few types, small sizes, shorter benchmark)
#   --ours PATH      our library        (env OURS,        default target/release/libnccl.so.2)
#   --bench PATH     the bench binary   (env BENCH,       default target/release/oxccl-bench)
#   --nvidia PATH    NVIDIA's library   (env NVIDIA_NCCL, default: found in Python's nvidia.nccl
#                    package, else by `find / -path '*nvidia/nccl*' -name libnccl.so.2`)
#   --gpus N         GPUs to use        (env NGPUS,       default: all that nvidia-smi -L lists)
#   env LABEL        name of the --lib-only library in file names (default nvidia or lib)
#   env CASE_LIMIT   seconds one bench invocation may run before it is killed (default 300)
# Output goes to ${OUT:-./out} in at most 7 files: matrix-<label>.log/.jsonl, vs.log/.jsonl,
# summary.txt. Exit status: 0 when every run passed and no result was wrong, 1 otherwise.
set -u -o pipefail

export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Every rank of these runs is on this machine: bootstrap and sockets over loopback only.
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"

OURS="${OURS:-target/release/libnccl.so.2}"
BENCH="${BENCH:-target/release/oxccl-bench}"
NVIDIA_NCCL="${NVIDIA_NCCL:-}"
NGPUS="${NGPUS:-}"
OUT="${OUT:-./out}"
QUICK=0
LIB_ONLY=""
# Per-invocation wall-clock cap (the bench has its own per-step watchdog; this is the backstop).
CASE_LIMIT="${CASE_LIMIT:-300}"

while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --lib-only) LIB_ONLY="$2"; shift ;;
    --ours) OURS="$2"; shift ;;
    --bench) BENCH="$2"; shift ;;
    --nvidia) NVIDIA_NCCL="$2"; shift ;;
    --gpus) NGPUS="$2"; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu-suite: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# cargo builds libnccl.so; programs look for its SONAME, libnccl.so.2.
if [ ! -e "$OURS" ] && [ -e "$(dirname "$OURS")/libnccl.so" ]; then
  ln -sf libnccl.so "$(dirname "$OURS")/libnccl.so.2"
fi

mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0

say() { echo "$*" | tee -a "$SUMMARY"; }

find_nvidia() {
  local dir
  for py in python3 python; do
    command -v "$py" > /dev/null 2>&1 || continue
    dir=$("$py" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2> /dev/null) || continue
    if [ -f "$dir/lib/libnccl.so.2" ]; then echo "$dir/lib/libnccl.so.2"; return 0; fi
  done
  if [ -f .toolchain/py/nvidia/nccl/lib/libnccl.so.2 ]; then
    echo ".toolchain/py/nvidia/nccl/lib/libnccl.so.2"; return 0
  fi
  find / -xdev -name libnccl.so.2 -path '*nvidia/nccl*' 2> /dev/null | head -n 1
}

absolute() { [ -e "$1" ] && realpath "$1" || echo "$1"; }

if [ ! -x "$BENCH" ]; then
  echo "gpu-suite: bench binary $BENCH not found; build it with: cargo build --release --bin oxccl-bench" >&2
  exit 2
fi
BENCH=$(absolute "$BENCH")

if [ -z "$NGPUS" ]; then
  NGPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)
fi
if [ -z "$NGPUS" ] || [ "$NGPUS" -lt 1 ]; then
  echo "gpu-suite: no GPU found (nvidia-smi -L lists none); pass --gpus N to override" >&2
  exit 2
fi
RANK_COUNTS=()
for n in 2 4; do [ "$n" -le "$NGPUS" ] && RANK_COUNTS+=("$n"); done
[ ${#RANK_COUNTS[@]} -eq 0 ] && RANK_COUNTS=("$NGPUS")

# run_case LOG JSONL NAME ARGS...: one bench invocation, appended to the given log and JSONL.
run_case() {
  local log="$1" jsonl="$2" name="$3"; shift 3
  local tmp tmplog rc wrong
  tmp=$(mktemp /tmp/gpu-suite.XXXXXX.jsonl)
  tmplog=$(mktemp /tmp/gpu-suite.XXXXXX.log)
  {
    echo "=================================================================="
    echo "== $name"
    echo "== $BENCH $*"
  } >> "$log"
  local started=$SECONDS
  timeout --kill-after=15 "$CASE_LIMIT" "$BENCH" "$@" --json "$tmp" > "$tmplog" 2>&1
  rc=$?
  cat "$tmplog" >> "$log"
  # Wrong elements summed from the JSON records ("?" when the run wrote none).
  if [ -s "$tmp" ]; then
    wrong=$(grep -o '"wrong":-\{0,1\}[0-9]*' "$tmp" | awk -F: '$2 > 0 { s += $2 } END { print s + 0 }')
    cat "$tmp" >> "$jsonl"
  else
    wrong="?"
  fi
  local verdict="ok"
  case $rc in
    0) ;;
    1) verdict="WRONG RESULTS" ;;
    2) verdict="BAD ARGUMENTS" ;;
    3) verdict="ERROR" ;;
    4) verdict="HANG" ;;
    124|137) verdict="KILLED after ${CASE_LIMIT}s" ;;
    *) verdict="FAILED (status $rc)" ;;
  esac
  [ $rc -ne 0 ] && FAILED=1
  say "$(printf '  %-44s %-22s wrong=%-8s %4ss' "$name" "$verdict" "${wrong:-?}" "$((SECONDS - started))")"
  if [ $rc -ne 0 ]; then
    grep -E 'oxccl-bench: .*(error|HANG|WRONG)' "$tmplog" | tail -n 3 | sed 's/^/      /' | tee -a "$SUMMARY"
  fi
  rm -f "$tmp" "$tmplog"
}

# The correctness matrix against one library.
matrix() {
  local lib="$1" label="$2"
  local log="$OUT/matrix-$label.log" jsonl="$OUT/matrix-$label.jsonl"
  : > "$log"; : > "$jsonl"
  say "== correctness matrix: $label ($lib), ranks: ${RANK_COUNTS[*]}"
  local small mid large large_p dtypes ops layouts
  if [ $QUICK -eq 1 ]; then
    small="0,1,12,100,1028,65540"
    mid="1048588"
    large="16777220"
    dtypes="int8,int32,half,float,bfloat16,fp8e4m3"
    ops="sum,prod,max,avg,premulsum"
    large_p="$large"
    layouts="g"
  else
    # 0 B, odd element counts for most types, and every protocol range up to 4 MiB.
    small="0,1,3,12,24,100,1028,4100,65540,262156"
    mid="1048588,4194332"
    large="16777220,67108864,268435468,1073741824"
    large_p="16777220,268435468"
    dtypes="all"
    ops="all"
    layouts="g p"
  fi
  for n in "${RANK_COUNTS[@]}"; do
    for layout in $layouts; do
      run_case "$log" "$jsonl" "$label -$layout $n all types/ops small" \
        --lib "$lib" -$layout "$n" -c all -d "$dtypes" -o "$ops" --sizes "$small" -w 1 -n 2
      run_case "$log" "$jsonl" "$label -$layout $n all types/ops mid" \
        --lib "$lib" -$layout "$n" -c all -d "$dtypes" -o "$ops" --sizes "$mid" -w 1 -n 2
      local sizes_large="$large"
      [ "$layout" = p ] && sizes_large="$large_p"
      run_case "$log" "$jsonl" "$label -$layout $n float sum large" \
        --lib "$lib" -$layout "$n" -c all -d float -o sum --sizes "$sizes_large" -w 1 -n 2
    done
    run_case "$log" "$jsonl" "$label -p $n graph float sum" \
      --lib "$lib" -p "$n" --graph -c all -d float -o sum,premulsum --sizes "0,12,1028,1048588" -w 1 -n 4
    run_case "$log" "$jsonl" "$label -g $n root=last" \
      --lib "$lib" -g "$n" -r $((n - 1)) -c broadcast,reduce,gather,scatter -d int32,half -o sum,max \
      --sizes "0,12,4100,1048588" -w 1 -n 2
  done
}

NVIDIA_LABEL="nvidia"
if [ -n "$LIB_ONLY" ]; then
  if [ ! -e "$LIB_ONLY" ]; then echo "gpu-suite: library $LIB_ONLY does not exist" >&2; exit 2; fi
  case "$(absolute "$LIB_ONLY")" in
    *nvidia/nccl*) label="nvidia" ;;
    *) label="lib" ;;
  esac
  matrix "$(absolute "$LIB_ONLY")" "${LABEL:-$label}"
else
  if [ ! -e "$OURS" ]; then
    echo "gpu-suite: our library $OURS not found; build it with: cargo build --release" >&2
    exit 2
  fi
  OURS=$(absolute "$OURS")
  [ -z "$NVIDIA_NCCL" ] && NVIDIA_NCCL=$(find_nvidia)
  matrix "$OURS" "ours"
  if [ -z "$NVIDIA_NCCL" ] || [ ! -e "$NVIDIA_NCCL" ]; then
    say "== NVIDIA's libnccl.so.2 not found (set NVIDIA_NCCL): side-by-side benchmark skipped"
    FAILED=1
  else
    NVIDIA_NCCL=$(absolute "$NVIDIA_NCCL")
    n_bench="${RANK_COUNTS[-1]}"
    say "== side by side: ours ($OURS) vs NVIDIA ($NVIDIA_NCCL), -g $n_bench, float sum"
    if [ $QUICK -eq 1 ]; then
      bench_sizes=(-b 8 -e 64M -f 16 -w 2 -n 5)
    else
      bench_sizes=(-b 8 -e 1G -f 4 -w 5 -n 20)
    fi
    : > "$OUT/vs.log"; : > "$OUT/vs.jsonl"
    run_case "$OUT/vs.log" "$OUT/vs.jsonl" "ours vs $NVIDIA_LABEL -g $n_bench" \
      --lib "$OURS" --vs "$NVIDIA_NCCL" -g "$n_bench" \
      -c all_reduce,all_gather,reduce_scatter,broadcast,sendrecv,alltoall -d float -o sum \
      --inplace 0 "${bench_sizes[@]}"
    say "== side-by-side summary (A = ours, B = NVIDIA; busbw in GB/s; ratio = A/B)"
    awk '/^# Side-by-side summary/{on=1} on' "$OUT/vs.log" | tee -a "$SUMMARY"
  fi
fi

if [ $FAILED -eq 0 ]; then say "== gpu-suite: all runs passed"; else say "== gpu-suite: SOME RUNS FAILED (see $OUT/*.log)"; fi
exit $FAILED
