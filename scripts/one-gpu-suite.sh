#!/usr/bin/env bash
# The one-GPU device run: oxccl with ranks sharing GPU 0 (NCCL_MULTI_RANK_GPU_ENABLE=1), run
# from the repository root on a machine with one GPU, with .device/ carried as staged by
# scripts/stage-device (.device/lib/libnccl.so.2 = ours, .device/bin/oxccl-bench, and
# .device/bin/<name> for every ffi-tests/gpu/<name>.c).
#
# usage: scripts/one-gpu-suite.sh [--only SECTIONS] [--budget SECONDS | SECONDS]
#   SECTIONS  a comma list of: ffi faults matrix bench copy torch net percall, run in the order
#             given (default: ffi faults matrix bench copy torch, in this order)
#   SECONDS   the whole run's time budget (default 540): every step runs under `timeout`, a
#             step that no longer fits is reported as SKIP (budget), and the run ends within
#             the budget. With several sections each gets a share of what is left when it
#             starts (weights ffi 3, faults 2, matrix 5, bench 3, copy 1, torch 4, net 5,
#             percall 3);
#             time a section does not use passes on to the next.
# Sections:
#   ffi     lifecycle -n 1 (ours); coll_config (the ncclXConfig collectives, 2 ranks on GPU 0,
#           ours; then against NVIDIA's library as a reference, -r: it refuses shared GPUs and
#           runs 1 rank, its answers that differ from ours print DIFF); shared_gpu (ours);
#           shared_gpu against NVIDIA's library as a reference (it refuses shared GPUs: those
#           cases print SKIP); rma2p (put/signal/wait between two processes on GPU 0, ours);
#           scripts/api232.sh (the 2.31-2.32 entry points, ours and NVIDIA's 2.32.3 side by
#           side, report only, under $OUT/api232)
#   faults  faults -n 2, then -n 4 if time is left (ffi-tests/gpu/faults.c, ours):
#           a rank that skips collective #4 (report only, then as an error), calls another
#           collective, another count, is SIGKILLed mid-collective, or skips a CUDA graph's
#           replay (graph-skip: the GPU's own report); the reports and errors
#           must name the right rank and operation and nothing may hang (each case bounded);
#           after each, the collective-check cases (faults -c check, OXCCL_CHECK_COLLECTIVES=1):
#           another collective, count or root as #4 (blocking and non-blocking), a mismatch
#           on one of two communicators in one group, and agreeing ranks with right results;
#           between the two rank counts, the classic cases with every rank claiming a host of
#           its own (faults -n 2 -H: the ranks meet over the network transport), then every
#           case with the ranks as threads of one process (faults -n 2 -t: one communicator
#           per thread, one log; kill has no thread form and is a SKIP line); last, if time
#           is left, faults -n 4 -t
#   matrix  oxccl-bench correctness matrix, ours, NCCL_MULTI_RANK_GPU_ENABLE=1, ranks on GPU
#           0: one process of 1, 2, 4, 8 ranks (--devices 0,..,0) and one process per rank for
#           2 and 4 (-p R --ranks-per-gpu R); every collective, type and op, in and out of
#           place, odd sizes 0 B .. 64 MiB+4 for 1 and 2 ranks in one process, to 16 MiB+4
#           otherwise, then 64 MiB+4 for 4 and 8 ranks with float/bfloat16/int8 and
#           sum/max/avg, all --check 1 -w 0 -n 1; then --graph and NCCL_P2P_DISABLE=1
#           subsets, then 4 ranks with the test tuner plugin forcing ring/LL on 3 channels and
#           ring/Simple on 5, in that order (what no longer fits is skipped). MATRIX_PART=2 skips the
#           first four steps; MATRIX_ONLY=REGEX runs only the steps whose names match. The
#           '#wrong' totals (JSON records) and WRONG lines are summed into the summary.
#   bench   one rank, ours vs NVIDIA side by side (-g 1 -c all, 8 B .. 1 GiB x4, in and out of
#           place), the same with --graph, and ours with 2, 4, 8 ranks on GPU 0
#           (all_reduce, all_gather, 8 B .. 256 MiB) for the record
#   copy    device-to-device cudaMemcpyAsync rate on GPU 0 (shared_gpu --copy-rate) at
#           1 MiB, 16 MiB, 256 MiB, 1 GiB, beside one-rank all_reduce/broadcast/sendrecv
#           times of ours and NVIDIA's at the same sizes
#   torch   scripts/torch-all.sh --same-gpu --gpus 4 --ours .device/lib/libnccl.so.2
#           --steps 50 (NVIDIA's refusal of shared GPUs is recorded as a reference line)
#   net     the network transport on GPU 0 over loopback (NCCL_SOCKET_IFNAME=lo): the matrix
#           with ranks forced onto it in one process (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1;
#           2, 4, 8 ranks, --graph) and with one process per rank claiming its own host
#           (--hostid-per-rank; 2, 4, 8 processes; and 4 and 6 on interleaved hosts,
#           --hosts 2 / 3: rings grouped by host), net_abort (ffi-tests/gpu/net_abort.c: a
#           rank waiting on the network is aborted; NVIDIA's hostid cases as a reference), abort
#           with the test plugin hung in a call (scripts/held-plugin-abort.sh), the
#           test net plugin under ours and NVIDIA's (host memory; then also taking CUDA
#           memory, which both libraries send from and receive into, also with sends staged in
#           host memory, NCCL_NET_GDR_READ=0, and LL only; then CUDA memory as dma-bufs only),
#           ours vs NVIDIA's sockets side by side, two "machines" in network namespaces with
#           hostnames of their own (scripts/two-hosts.sh, torch, both libraries), oxccl-netbench (the socket network
#           against a plain TCP pair, reference rows), and torch-hostid (scripts/torch-all.sh
#           --hostid: DDP on 2 and 4 ranks over the network, loss curves against NVIDIA's).
#           MATRIX_ONLY=REGEX runs only its steps that match.
#   percall the per-call cost of small collectives side by side, timed by NVIDIA's nccl-tests
#           (scripts/nccl-tests.sh run; needs .device/nccl-tests from scripts/nccl-tests.sh build
#           and .device/ref): the nine collectives, -g 1, 8 B-8 MiB, out of place, ours, NVIDIA
#           2.32.3 and 2.28.9 taking turns, 3 runs each, pinned to scripts/gpu-cpus 2; then the
#           level probe: one-rank all_reduce up to 128 KiB with each run pinned to one of those
#           CPUs alone (which CPU a caller runs on moves every library by 1-2 µs); then
#           scripts/hostpath.sh modes 1 and p (the caller's, the stream's and the process's CPU
#           time per call, 8 B-2 MiB, one rank and two processes under MPS). The tables are in
#           percall.log and the runs' logs in percall/.
# Output in ${OUT:-./out}: summary.txt (also printed last) and one-gpu-suite.tar.gz, which holds
# machine.log and one SECTION.log per section run (each kept under 16 MiB) and the folders of
# the steps that write their own (api232, two-hosts, ...).
# Exit status: 0 when no step failed (reference runs and budget skips do not count), else 1.
set -u -o pipefail

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Every rank of these runs is on this machine: bootstrap and sockets over loopback only.
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
unset NCCL_MULTI_RANK_GPU_ENABLE LD_PRELOAD # set per step where it is meant

BUDGET=540
ONLY="ffi,faults,matrix,bench,copy,torch"
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY="${2:-}"; shift ;;
    --budget) BUDGET="${2:-}"; shift ;;
    -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;
    [0-9]*) BUDGET="$1" ;;
    *) echo "one-gpu-suite: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$BUDGET" in
  "" | *[!0-9]*) echo "one-gpu-suite: the budget must be seconds, got '$BUDGET'" >&2; exit 2 ;;
esac
SECTIONS=()
for s in ${ONLY//,/ }; do
  case "$s" in
    ffi | faults | matrix | bench | copy | torch | net | percall) SECTIONS+=("$s") ;;
    *) echo "one-gpu-suite: unknown section '$s' (ffi faults matrix bench copy torch net percall)" >&2; exit 2 ;;
  esac
done
[ ${#SECTIONS[@]} -gt 0 ] || { echo "one-gpu-suite: no section selected" >&2; exit 2; }

START=$SECONDS
END=$((START + BUDGET))
RESERVE=15 # kept back for the summary and a killed step's grace period
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
TMP=$(mktemp -d /tmp/one-gpu-suite.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
for s in ffi faults matrix bench copy torch net percall; do
  for x in "${SECTIONS[@]}"; do [ "$x" = "$s" ] && : >"$OUT/$s.log"; done
done

HERE=$(cd "$(dirname "$0")" && pwd)
DEV=$PWD/.device
OURS=$DEV/lib/libnccl.so.2
BENCH=$DEV/bin/oxccl-bench
NVLIB=""
nvdir=$(timeout 60 python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$nvdir" ] && [ -f "$nvdir/libnccl.so.2" ] && NVLIB=$nvdir/libnccl.so.2
NVDIR=${NVLIB:+$(dirname "$NVLIB")}
# NVIDIA's 2.32.3 (carried xz-packed in $DEV/ref, made by ../shared/tools/nccl-reference 2.32.3
# 90 .device/ref): the folder of its libnccl.so.2, unpacked on first use; fails when not carried.
ref_232_dir() {
  local d=$DEV/ref/lib
  if [ ! -f "$d/libnccl.so.2" ]; then
    [ -f "$DEV/ref/libnccl-2.32.3.so.2.xz" ] || return 1
    mkdir -p "$d" && xz -dc "$DEV/ref/libnccl-2.32.3.so.2.xz" >"$d/libnccl.so.2.part" &&
      mv "$d/libnccl.so.2.part" "$d/libnccl.so.2" || return 1
  fi
  echo "$d"
}

ROWS=()
FAILED=0
MATRIX_WRONG=0
MATRIX_WRONG_LINES=0
MATRIX_RUNS=0
MATRIX_UNKNOWN=0

elapsed() { echo $((SECONDS - START)); }
say() { echo "[$(printf '%4d' "$(elapsed)") s] $*"; }
# row SECTION NAME VERDICT WRONG SECONDS NOTE
row() {
  local line
  line=$(printf '%-6s %-34s %-10s %9s %5s  %s' "$1" "$2" "$3" "$4" "$5" "${6:-}")
  ROWS+=("$line")
  say "$1 $2: $3${6:+ ($6)}"
}

# ---- time: each section gets a share of what is left; a step gets min(nominal, section, run)
declare -A WEIGHT=([ffi]=3 [faults]=2 [matrix]=5 [bench]=3 [copy]=1 [torch]=4 [net]=5 [percall]=3)
SEC_END=$END
section_begin() { # NAME INDEX: the section's end time, from the weights of it and those after
  local i rest=0 avail
  for ((i = $2; i < ${#SECTIONS[@]}; i++)); do rest=$((rest + WEIGHT[${SECTIONS[$i]}])); done
  avail=$((END - RESERVE - SECONDS))
  SEC_END=$((SECONDS + avail * WEIGHT[$1] / rest))
  # At least 45 s (or what is left), so that a light section is not starved by its weight.
  [ $((SEC_END - SECONDS)) -lt 45 ] && SEC_END=$((SECONDS + (avail < 45 ? avail : 45)))
  say "== section $1: about $((SEC_END - SECONDS)) s of $((END - SECONDS)) s left"
  echo "######## section $1 (allowance $((SEC_END - SECONDS)) s, $((END - SECONDS)) s left in the run)" >>"$OUT/$1.log"
}
# plan SECTION NAME NOMINAL [LEAVE]: sets LIMIT (and CUT=1 when the budget shortened it);
# returns 1, with a SKIP row, when less than 20 s would be left for the step. LEAVE: seconds
# of the section kept for the steps after this one.
plan() {
  local leave=${4:-0} a g
  LIMIT=$3
  CUT=0
  # What is kept for the later steps never takes more than half of what the section has
  # left, and nothing when this step would get less than 20 s otherwise.
  [ "$leave" -gt $(((SEC_END - SECONDS) / 2)) ] && leave=$(((SEC_END - SECONDS) / 2))
  a=$((SEC_END - leave - SECONDS))
  [ "$a" -lt 20 ] && a=$((SEC_END - SECONDS))
  g=$((END - RESERVE - SECONDS))
  if [ "$a" -lt "$LIMIT" ]; then LIMIT=$a; CUT=1; fi
  if [ "$g" -lt "$LIMIT" ]; then LIMIT=$g; CUT=1; fi
  if [ "$LIMIT" -lt 20 ]; then
    row "$1" "$2" SKIP - 0 "time budget: $((SEC_END - SECONDS)) s left for the section, $((END - SECONDS)) s in the run"
    return 1
  fi
  return 0
}
# runstep SECTION NAME CMD...: CMD under timeout LIMIT, its output appended to SECTION.log and
# kept in $TMP/step.out; sets RC and ELAPSED.
runstep() {
  local log=$OUT/$1.log name=$2
  shift 2
  {
    echo "=================================================================="
    echo "== $name (limit ${LIMIT} s, at $(elapsed) s)"
    echo "== $*"
  } >>"$log"
  local t0=$SECONDS
  timeout -k 10 "$LIMIT" "$@" >"$TMP/step.out" 2>&1
  RC=$?
  ELAPSED=$((SECONDS - t0))
  cat "$TMP/step.out" >>"$log"
  echo "== $name: exit $RC after ${ELAPSED} s" >>"$log"
}
killed() { [ "$RC" = 124 ] || [ "$RC" = 137 ]; }

# A test program with a 'N passed, M failed' line: ok iff exit 0.
# test_step SECTION NAME NOMINAL REFERENCE(0|1) CMD...
test_step() {
  local sec=$1 name=$2 nominal=$3 ref=$4
  shift 4
  only "$sec" "$name" || return 0
  plan "$sec" "$name" "$nominal" "${LEAVE:-0}" || return 0
  runstep "$sec" "$name" "$@"
  local line verdict note
  line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$TMP/step.out" | tail -1)
  if [ "$RC" = 0 ]; then verdict=ok; elif killed; then verdict=KILLED; else verdict=FAIL; fi
  # Cases the test's own time limit kept from starting are the budget's doing, not failures:
  # nothing failed and every case not run says "time budget" (as a bench step cut short).
  if [ "$verdict" = FAIL ] && [[ $line =~ (^|[^0-9])0\ failed ]] && grep -q '^NOT RUN ' "$TMP/step.out" &&
    ! grep '^NOT RUN ' "$TMP/step.out" | grep -qv 'time budget'; then
    verdict=CUT
  fi
  note="${line:-no 'N passed' line; last: $(grep -v '^\s*$' "$TMP/step.out" | tail -1 | cut -c1-120)}"
  killed && note="killed at ${LIMIT} s$([ "$CUT" = 1 ] && echo ' (budget)'); $note"
  if [ "$ref" = 1 ]; then
    row "$sec" "$name" "ref:$verdict" - "$ELAPSED" "reference, not counted: $note"
  else
    case $verdict in ok | CUT) ;; *) FAILED=1 ;; esac
    row "$sec" "$name" "$verdict" - "$ELAPSED" "$note"
  fi
  grep -E '^(FAIL|SKIP|NOT RUN|DIFF) ' "$TMP/step.out" | head -20 | sed 's/^/      /'
}

# only SECTION NAME: 1 when MATRIX_ONLY=REGEX is set and a matrix or net step's name does not
# match it (a re-run of a few steps).
only() {
  [[ $1 == matrix || $1 == net ]] && [ -n "${MATRIX_ONLY:-}" ] && ! [[ $2 =~ $MATRIX_ONLY ]] && return 1
  return 0
}

# One oxccl-bench run. bench_step SECTION NAME NOMINAL [env VAR=...] -- BENCH-ARGS...
# Everything before "--" prefixes the command (e.g. env NCCL_MULTI_RANK_GPU_ENABLE=1).
bench_step() {
  local sec=$1 name=$2 nominal=$3
  shift 3
  local pre=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do pre+=("$1"); shift; done
  shift
  only "$sec" "$name" || return 0
  if [ ! -x "$BENCH" ]; then
    row "$sec" "$name" SKIP - 0 "$BENCH missing (scripts/stage-device)"
    return 0
  fi
  plan "$sec" "$name" "$nominal" "${LEAVE:-0}" || return 0
  rm -f "$TMP/step.jsonl"
  runstep "$sec" "$name" ${pre[@]+"${pre[@]}"} "$BENCH" "$@" --json "$TMP/step.jsonl"
  local wrong wlines verdict note refused
  if [ -s "$TMP/step.jsonl" ]; then
    wrong=$(grep -o '"wrong":-\{0,1\}[0-9]*' "$TMP/step.jsonl" | awk -F: '$2 > 0 { s += $2 } END { print s + 0 }')
  else
    wrong="?"
  fi
  wlines=$(grep -c 'oxccl-bench: WRONG' "$TMP/step.out")
  refused=$(grep -m1 'REFUSED' "$TMP/step.out" | cut -c1-160)
  case $RC in
    0) verdict=ok ;;
    1) verdict=WRONG ;;
    2) verdict=BADARGS ;;
    3) verdict=ERROR; [ -n "$refused" ] && verdict=REFUSED ;;
    4) verdict=HANG ;;
    124 | 137) verdict=KILLED; [ "$CUT" = 1 ] && verdict=CUT ;;
    *) verdict="FAIL($RC)" ;;
  esac
  local parts=() totals err
  [ "$verdict" = CUT ] && parts+=("stopped at the budget (${LIMIT} s)")
  [ -n "$refused" ] && parts+=("$refused")
  [ "$wlines" -gt 0 ] && parts+=("$wlines WRONG lines")
  totals=$(grep -E '# Wrong elements in total' "$TMP/step.out" | sed 's/^.*# Wrong elements in total/wrong in total/' | paste -sd ';' - | cut -c1-100)
  [ -n "$totals" ] && parts+=("$totals")
  if [ "$RC" != 0 ] && [ "$RC" != 1 ]; then
    err=$(grep -E 'oxccl-bench: .*(error|HANG|hang|REFUSED)' "$TMP/step.out" | tail -1 | cut -c1-160)
    [ -n "$err" ] && [ "$err" != "$refused" ] && parts+=("$err")
  fi
  note=$(printf '%s; ' ${parts[@]+"${parts[@]}"})
  note=${note%; }
  if [[ $sec == matrix || $sec == net ]]; then
    MATRIX_RUNS=$((MATRIX_RUNS + 1))
    MATRIX_WRONG_LINES=$((MATRIX_WRONG_LINES + wlines))
    if [ "$wrong" = "?" ]; then MATRIX_UNKNOWN=$((MATRIX_UNKNOWN + 1)); else MATRIX_WRONG=$((MATRIX_WRONG + wrong)); fi
  fi
  # A run stopped by the budget is not a failure of the library (its rows so far are checked).
  case $verdict in ok | CUT) ;; *) FAILED=1 ;; esac
  [ "$verdict" = CUT ] && [ "$wrong" != "?" ] && [ "$wrong" -gt 0 ] && FAILED=1
  row "$sec" "$name" "$verdict" "$wrong" "$ELAPSED" "$note"
  grep -E 'oxccl-bench: (WRONG|.*error|.*HANG)' "$TMP/step.out" | head -3 | cut -c1-200 | sed 's/^/      /'
}

zeros() { local n=$1 s=0 i; for ((i = 1; i < n; i++)); do s="$s,0"; done; echo "$s"; }

# ---- machine
{
  echo "one-gpu-suite: sections ${SECTIONS[*]}, budget ${BUDGET} s, out $OUT"
  date -u
  timeout 30 nvidia-smi -L
  timeout 30 nvidia-smi
  echo "ours: $OURS"; ls -la "$DEV/lib" "$DEV/bin" 2>&1
  echo "NVIDIA's NCCL: ${NVLIB:-not found (python3 -c 'import nvidia.nccl')}"
  timeout 60 python3 -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-nccl)'
  env | grep -E '^(NCCL_|CUDA_|TORCH_|NVSHMEM_)' | sort
} >"$OUT/machine.log" 2>&1
say "one-gpu-suite: sections ${SECTIONS[*]}; budget ${BUDGET} s; ours $OURS; NVIDIA ${NVLIB:-not found}"
[ -f "$OURS" ] || say "WARNING: $OURS missing: run scripts/stage-device and carry .device"
# A torch-all run killed before its trap ran leaves ours in NVIDIA's place; put NVIDIA's back.
if [ -n "$NVLIB" ] && [ -f "$NVLIB.torch-all-backup" ]; then
  if cp -p "$NVLIB.torch-all-backup" "$NVLIB.one-gpu-tmp" && mv -f "$NVLIB.one-gpu-tmp" "$NVLIB"; then
    rm -f "$NVLIB.torch-all-backup"
    say "restored NVIDIA's $NVLIB from an interrupted torch-all run"
  fi
fi

# ---- sections
sec_ffi() {
  if [ ! -x "$DEV/bin/shared_gpu" ] || [ ! -x "$DEV/bin/lifecycle" ]; then
    say "ffi: $DEV/bin/shared_gpu or lifecycle missing (scripts/stage-device)"
  fi
  if [ -x "$DEV/bin/lifecycle" ]; then
    LEAVE=60 test_step ffi "lifecycle -n 1 (ours)" 120 0 env LD_LIBRARY_PATH="$DEV/lib" "$DEV/bin/lifecycle" -n 1
  else
    row ffi "lifecycle -n 1 (ours)" SKIP - 0 "$DEV/bin/lifecycle missing"
  fi
  if [ -x "$DEV/bin/coll_config" ]; then
    LEAVE=60 test_step ffi "coll_config (ours)" 120 0 env LD_LIBRARY_PATH="$DEV/lib" "$DEV/bin/coll_config" -n 2
    # The ncclXConfig collectives exist from NVIDIA's 2.32 on: the reference is its 2.32.3.
    if ref232=$(ref_232_dir); then
      LEAVE=60 test_step ffi "coll_config (NVIDIA 2.32.3 reference)" 120 1 env LD_LIBRARY_PATH="$ref232" \
        NCCL_MULTI_RANK_GPU_ENABLE=1 "$DEV/bin/coll_config" -n 2 -r
    else
      row ffi "coll_config (NVIDIA 2.32.3 reference)" SKIP - 0 "$DEV/ref (../shared/tools/nccl-reference 2.32.3 90 .device/ref) missing"
    fi
  else
    row ffi "coll_config (ours)" SKIP - 0 "$DEV/bin/coll_config missing"
  fi
  # One-sided operations between two processes on GPU 0 (windows of ncclMemAlloc memory).
  if [ -x "$DEV/bin/rma2p" ]; then
    LEAVE=60 test_step ffi "rma2p (ours)" 60 0 env LD_LIBRARY_PATH="$DEV/lib" NCCL_MULTI_RANK_GPU_ENABLE=1 \
      "$DEV/bin/rma2p"
  else
    row ffi "rma2p (ours)" SKIP - 0 "$DEV/bin/rma2p missing"
  fi
  ffi_shared_gpu
  ffi_api232
}

ffi_shared_gpu() {
  [ -x "$DEV/bin/shared_gpu" ] || { row ffi shared_gpu SKIP - 0 "$DEV/bin/shared_gpu missing"; return 0; }
  local leave=0
  [ -n "$NVLIB" ] && leave=45
  # shared_gpu's own -T stops it starting cases it has no time for (reported as not run).
  if plan ffi "shared_gpu (ours)" 360 "$leave"; then
    local lim=$LIMIT
    LEAVE=$leave test_step ffi "shared_gpu (ours)" "$lim" 0 env LD_LIBRARY_PATH="$DEV/lib" \
      "$DEV/bin/shared_gpu" -T $((lim - 12))
  fi
  if [ -z "$NVLIB" ]; then
    row ffi "shared_gpu (NVIDIA reference)" SKIP - 0 "NVIDIA's libnccl.so.2 not found"
  elif plan ffi "shared_gpu (NVIDIA reference)" 180; then
    local lim=$LIMIT
    test_step ffi "shared_gpu (NVIDIA reference)" "$lim" 1 env LD_LIBRARY_PATH="$NVDIR" \
      "$DEV/bin/shared_gpu" -T $((lim - 12))
  fi
}

ffi_api232() {
  # The 2.31-2.32 entry points against NVIDIA's 2.32.3 (.device/ref), side by side: a record.
  if [ -x "$DEV/bin/api232" ] && [ -f "$DEV/ref/libnccl-2.32.3.so.2.xz" ]; then
    test_step ffi "api232 side by side with NVIDIA 2.32.3 (report)" 400 1 \
      env OUT="$OUT/api232" bash scripts/api232.sh
  else
    row ffi "api232 side by side" SKIP - 0 "$DEV/bin/api232 or $DEV/ref (../shared/tools/nccl-reference 2.32.3 90 .device/ref) missing"
  fi
}

sec_faults() {
  if [ ! -x "$DEV/bin/faults" ]; then
    row faults "faults" SKIP - 0 "$DEV/bin/faults missing (scripts/stage-device)"
    return 0
  fi
  # Per rank count: the fault cases, then the collective-check cases (OXCCL_CHECK_COLLECTIVES=1);
  # at 2 ranks then the classic cases with a host per rank (-H) and every case with the ranks
  # as threads of one process (-t; its kill case is a SKIP line); -n 4 -t last, if time is
  # left. LEAVE keeps time for the steps after each.
  local step n cases name nominal leave mode
  for step in "2 classic 330 -" "2 check 270 -" "2 classic 210 -H" "2 all 120 -t" "4 classic 60 -" \
    "4 check 0 -" "4 all 0 -t"; do
    read -r n cases leave mode <<<"$step"
    [ "$mode" = - ] && mode=
    case $cases in
      classic)
        name="faults -n $n${mode:+ $mode} (ours)"
        cases=skip-report,skip,collective,count,kill,graph-skip
        nominal=330
        ;;
      check)
        name="faults check -n $n (ours)"
        nominal=200
        ;;
      all)
        name="faults -n $n${mode:+ $mode} (ours)"
        cases=skip-report,skip,collective,count,kill,graph-skip,check
        nominal=480
        ;;
    esac
    # faults' own -T stops it starting cases it has no time for (reported as not run).
    if plan faults "$name" "$nominal" "$leave"; then
      local lim=$LIMIT
      LEAVE=$leave test_step faults "$name" "$lim" 0 env LD_LIBRARY_PATH="$DEV/lib" \
        "$DEV/bin/faults" -n "$n" ${mode:+"$mode"} -c "$cases" -T $((lim - 12))
    fi
  done
}

sec_matrix() {
  local common=(--lib "$OURS" -c all -d all -o all --inplace both --check 1 -w 0 -n 1 --timeout 30)
  local full=0,1,12,1028,65540,1048580,16777220,67108868
  local mid=0,1,12,1028,65540,1048580,16777220
  local upto1m=0,1,12,1028,65540,1048580
  local small=0,12,1028,65540,1048580
  local multi=(env NCCL_MULTI_RANK_GPU_ENABLE=1)
  # In order of importance: a step that no longer fits the budget is skipped (SKIP rows).
  # MATRIX_PART=2 runs only the steps after the four largest (a second device call).
  if [ "${MATRIX_PART:-1}" != 2 ]; then
    bench_step matrix "R=1 one process (--devices 0)" 120 "${multi[@]}" -- "${common[@]}" --devices 0 --sizes "$full"
    bench_step matrix "R=2 one process" 240 "${multi[@]}" -- "${common[@]}" --devices "$(zeros 2)" --sizes "$full"
    bench_step matrix "R=2 processes" 200 "${multi[@]}" -- "${common[@]}" -p 2 --ranks-per-gpu 2 --sizes "$mid"
    bench_step matrix "R=4 one process" 240 "${multi[@]}" -- "${common[@]}" --devices "$(zeros 4)" --sizes "$mid"
  fi
  bench_step matrix "R=8 one process" 120 "${multi[@]}" -- "${common[@]}" --devices "$(zeros 8)" --sizes "$upto1m"
  bench_step matrix "R=4 processes" 120 "${multi[@]}" -- "${common[@]}" -p 4 --ranks-per-gpu 4 --sizes "$upto1m"
  # shellcheck disable=SC2054 # commas inside the -d and -o values
  bench_step matrix "R=8 processes subset" 90 "${multi[@]}" -- --lib "$OURS" -c all -d float,int8,bfloat16 \
    -o sum,min,premulsum --inplace both --check 1 -w 0 -n 1 --timeout 30 -p 8 --ranks-per-gpu 8 --sizes "$small"
  # shellcheck disable=SC2054 # commas inside the -c, -d and -o values
  bench_step matrix "R=4 one process root=3" 60 "${multi[@]}" -- --lib "$OURS" -r 3 \
    -c broadcast,reduce,gather,scatter -d int32,half,float -o sum,max --inplace both --check 1 -w 0 -n 1 \
    --timeout 30 --devices "$(zeros 4)" --sizes 0,12,4100,1048588
  # The largest sizes for 4 and 8 ranks with fewer types and ops.
  # shellcheck disable=SC2054 # commas inside the -d and -o values
  local large=(--lib "$OURS" -c all -d float,bfloat16,int8 -o sum,max,avg --inplace both --check 1 -w 0 -n 1
    --timeout 60)
  bench_step matrix "R=4 one process 64 MiB+4 subset" 90 "${multi[@]}" -- "${large[@]}" --devices "$(zeros 4)" \
    --sizes 67108868
  bench_step matrix "R=8 one process 16, 64 MiB+4 subset" 200 "${multi[@]}" -- "${large[@]}" --devices "$(zeros 8)" \
    --sizes 16777220,67108868
  # shellcheck disable=SC2054 # commas inside the -d and -o values
  local sub=(--lib "$OURS" -c all -d float,int32,bfloat16 -o sum,premulsum,max --inplace both --check 1 --timeout 30)
  bench_step matrix "R=4 one process --graph" 90 "${multi[@]}" -- "${sub[@]}" --devices "$(zeros 4)" --graph \
    --sizes 0,12,1028,1048580 -w 1 -n 2
  bench_step matrix "R=2 processes --graph" 90 "${multi[@]}" -- "${sub[@]}" -p 2 --ranks-per-gpu 2 --graph \
    --sizes 0,12,1028,1048580 -w 1 -n 2
  bench_step matrix "R=1 one process --graph" 30 "${multi[@]}" -- "${sub[@]}" --devices 0 --graph \
    --sizes 0,12,1028,1048580,8388612 -w 1 -n 2
  bench_step matrix "R=4 one process NCCL_P2P_DISABLE=1" 90 "${multi[@]}" NCCL_P2P_DISABLE=1 -- "${sub[@]}" \
    --devices "$(zeros 4)" --sizes "$small" -w 0 -n 1
  bench_step matrix "R=2 processes NCCL_P2P_DISABLE=1" 90 "${multi[@]}" NCCL_P2P_DISABLE=1 -- "${sub[@]}" \
    -p 2 --ranks-per-gpu 2 --sizes "$small" -w 0 -n 1
  # A tuner plugin's choices on real kernels: the test tuner forcing ring/LL on 3 channels,
  # then ring/Simple on 5, for the ring collectives of 4 ranks.
  local tuner=$DEV/lib/libnccl-tuner-oxtest.so
  # shellcheck disable=SC2054 # commas inside the -c, -d and -o values
  local rings=(--lib "$OURS" -c all_reduce,all_gather,reduce_scatter,broadcast,reduce -d float,int8 -o sum,max
    --inplace both --check 1 -w 0 -n 1 --timeout 30 --devices "$(zeros 4)" --sizes "$small")
  bench_step matrix "R=4 tuner ring/LL 3 channels" 60 "${multi[@]}" NCCL_TUNER_PLUGIN="$tuner" \
    OXTEST_TUNER_PICK=ring,ll OXTEST_TUNER_CHANNELS=3 -- "${rings[@]}"
  bench_step matrix "R=4 tuner ring/Simple 5 channels" 60 "${multi[@]}" NCCL_TUNER_PLUGIN="$tuner" \
    OXTEST_TUNER_PICK=ring,simple OXTEST_TUNER_CHANNELS=5 -- "${rings[@]}"
}

# The network transport on one GPU: ranks forced onto it in one process
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), ranks claiming separate hosts (--hostid-per-rank),
# the test net plugin under ours and under NVIDIA's, and the side-by-side with NVIDIA's socket
# transport. Loopback only (NCCL_SOCKET_IFNAME=lo).
sec_net() {
  local lo=(env NCCL_SOCKET_IFNAME=lo)
  local forced=("${lo[@]}" NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
  local common=(--lib "$OURS" -c all -d all -o all --inplace both --check 1 -w 0 -n 1 --timeout 30)
  # shellcheck disable=SC2054 # commas inside the -d and -o values
  local sub=(--lib "$OURS" -c all -d float,int8,bfloat16,double -o sum,max,premulsum --inplace both --check 1
    -w 0 -n 1 --timeout 30)
  local plugin=NCCL_NET_PLUGIN=$DEV/lib/liboxtest_net.so
  bench_step net "net R=2 one process forced" 150 "${forced[@]}" -- "${common[@]}" --devices 0,0 \
    --sizes 0,1,12,1028,65540,1048580,16777220
  bench_step net "net R=4 one process forced" 120 "${forced[@]}" -- "${common[@]}" --devices 0,0,0,0 \
    --sizes 0,1,12,1028,65540,1048580
  bench_step net "net R=2 processes hostid" 150 "${lo[@]}" -- "${sub[@]}" -p 2 --ranks-per-gpu 2 --hostid-per-rank \
    --sizes 0,12,1028,65540,1048580,16777220
  bench_step net "net R=8 one process forced subset" 90 "${forced[@]}" -- "${sub[@]}" \
    --devices "$(zeros 8)" --sizes 0,12,65540,1048580
  bench_step net "net R=4 processes hostid subset" 90 "${lo[@]}" -- "${sub[@]}" -p 4 --ranks-per-gpu 4 --hostid-per-rank \
    --sizes 0,12,65540,1048580
  # Interleaved hosts (rank r on host r % H): rings grouped by host, not in rank order. The
  # ranks of one host share GPU 0 (NCCL_MULTI_RANK_GPU_ENABLE=1).
  bench_step net "net R=4 processes, 2 interleaved hosts" 120 "${lo[@]}" NCCL_MULTI_RANK_GPU_ENABLE=1 -- "${sub[@]}" -p 4 --ranks-per-gpu 4 \
    --hosts 2 --sizes 0,1,12,1028,65540,1048580
  bench_step net "net R=6 processes, 3 interleaved hosts, ring collectives" 90 "${lo[@]}" NCCL_MULTI_RANK_GPU_ENABLE=1 -- "${sub[@]}" -p 6 \
    --ranks-per-gpu 6 --hosts 3 -c all_reduce,all_gather,reduce_scatter,broadcast,reduce --sizes 0,12,65540,1048580
  # shellcheck disable=SC2054 # commas inside the -d and -o values
  bench_step net "net R=8 processes hostid subset" 90 "${lo[@]}" -- --lib "$OURS" -c all -d float,int8,bfloat16 \
    -o sum,premulsum --inplace both --check 1 -w 0 -n 1 --timeout 30 -p 8 --ranks-per-gpu 8 --hostid-per-rank \
    --sizes 0,12,65540,1048580
  # ncclCommAbort of a rank waiting on the network (net_abort's own -T stops it starting cases
  # it has no time for: reported as not run); NVIDIA's runs the hostid cases as a reference.
  if [ ! -x "$DEV/bin/net_abort" ]; then
    only net "net_abort (ours)" && row net "net_abort (ours)" SKIP - 0 "$DEV/bin/net_abort missing (scripts/stage-device)"
  elif only net "net_abort (ours)" && plan net "net_abort (ours)" 180 30; then
    local lim=$LIMIT
    LEAVE=30 test_step net "net_abort (ours)" "$lim" 0 env LD_LIBRARY_PATH="$DEV/lib" "$DEV/bin/net_abort" \
      -T $((lim - 12))
  fi
  if [ -n "$NVLIB" ] && [ -x "$DEV/bin/net_abort" ] && only net "net_abort hostid (NVIDIA reference)" &&
    plan net "net_abort hostid (NVIDIA reference)" 100; then
    local nlim=$LIMIT
    test_step net "net_abort hostid (NVIDIA reference)" "$nlim" 1 env LD_LIBRARY_PATH="$NVDIR" \
      "$DEV/bin/net_abort" -c hostid -T $((nlim - 12))
  fi
  # A plugin hung in a call: ncclCommAbort must still return (scripts/held-plugin-abort.sh).
  test_step net "net plugin held in a call: abort returns (ours)" 60 0 "$HERE/held-plugin-abort.sh" \
    "$DEV/bin/oxccl-bench" "$OURS" "$DEV/lib/liboxtest_net.so"
  bench_step net "net R=2 one process forced --graph" 60 "${forced[@]}" -- "${sub[@]}" --devices 0,0 --graph \
    --sizes 0,12,1028,1048580 -w 1 -n 2
  bench_step net "net plugin OxTest R=2 hostid (ours)" 60 "${lo[@]}" "$plugin" NCCL_NET=OxTest -- "${sub[@]}" \
    -p 2 --ranks-per-gpu 2 --hostid-per-rank --sizes 0,12,65540,1048580
  # The plugin taking CUDA memory too, as a GPUDirect RDMA plugin (OXTEST_PTR_CUDA=1; it copies
  # through host memory): ours and NVIDIA's receive into GPU memory with it and send from it
  # (NCCL_NET_GDR_LEVEL=SYS: the plugin's device has no PCI path); then sending sides staged in
  # host memory (NCCL_NET_GDR_READ=0), ranks forced onto it in one process with LL only (the
  # plugin's copies in a context of their own), and
  # the plugin taking CUDA memory as dma-bufs only (OXTEST_PTR_DMABUF=1).
  local cudaplugin=("$plugin" NCCL_NET=OxTest OXTEST_PTR_CUDA=1 NCCL_NET_GDR_LEVEL=SYS)
  local dmabufplugin=("$plugin" NCCL_NET=OxTest OXTEST_PTR_DMABUF=1 NCCL_NET_GDR_LEVEL=SYS)
  bench_step net "net plugin OxTest CUDA memory R=2 hostid (ours)" 60 "${lo[@]}" "${cudaplugin[@]}" -- "${sub[@]}" \
    -p 2 --ranks-per-gpu 2 --hostid-per-rank --sizes 0,12,65540,1048580
  bench_step net "net plugin OxTest CUDA memory GDR_READ=0 R=2 hostid (ours)" 60 "${lo[@]}" "${cudaplugin[@]}" \
    NCCL_NET_GDR_READ=0 -- "${sub[@]}" -p 2 --ranks-per-gpu 2 --hostid-per-rank --sizes 0,12,65540,1048580
  # Ranks forced into one process: the plugin copies in a CUDA context of its own
  # (OXTEST_CUDA_CONTEXT=own), or a copy may queue in the GPU behind another rank's stream
  # waiting for the launch it feeds (docs/gdr.md); the GPU time-slices the two contexts, so
  # fewer types and ops.
  # shellcheck disable=SC2054 # commas inside the -d and -o values
  bench_step net "net plugin OxTest CUDA memory R=4 forced LL (ours)" 90 "${forced[@]}" "${cudaplugin[@]}" \
    OXTEST_CUDA_CONTEXT=own NCCL_PROTO=LL -- --lib "$OURS" -c all -d float,bfloat16 -o sum,premulsum \
    --inplace both --check 1 -w 0 -n 1 --timeout 30 --devices 0,0,0,0 --sizes 0,12,65540,1048580
  bench_step net "net plugin OxTest dma-buf R=2 hostid (ours)" 60 "${lo[@]}" "${dmabufplugin[@]}" -- "${sub[@]}" \
    -p 2 --ranks-per-gpu 2 --hostid-per-rank --sizes 0,12,65540,1048580
  if [ -n "$NVLIB" ]; then
    local nsub=("${sub[@]}")
    nsub[1]=$NVLIB
    bench_step net "net plugin OxTest R=2 hostid (NVIDIA)" 60 "${lo[@]}" "$plugin" NCCL_NET=OxTest \
      -- "${nsub[@]}" -p 2 --ranks-per-gpu 2 --hostid-per-rank --sizes 0,12,65540,1048580
    bench_step net "net plugin OxTest CUDA memory R=2 hostid (NVIDIA)" 60 "${lo[@]}" "${cudaplugin[@]}" \
      -- "${nsub[@]}" -p 2 --ranks-per-gpu 2 --hostid-per-rank --sizes 0,12,65540,1048580
    bench_step net "net plugin OxTest dma-buf R=2 hostid (NVIDIA)" 60 "${lo[@]}" "${dmabufplugin[@]}" \
      -- "${nsub[@]}" -p 2 --ranks-per-gpu 2 --hostid-per-rank --sizes 0,12,65540,1048580
    LEAVE=30 bench_step net "net R=2 hostid: ours vs NVIDIA sockets" 200 "${lo[@]}" -- --lib "$OURS" \
      --vs "$NVLIB" -p 2 --ranks-per-gpu 2 --hostid-per-rank -c all_reduce,all_gather,sendrecv -d float -o sum -b 8 -e 128M -f 4 \
      --inplace 0 --check 1 -w 3 -n 10 --timeout 60
  fi
  # The socket network against a plain TCP pair (#12 item 2's bar), default shape and 2 x 2:
  # a measurement (reference row; the numbers are in the step's log).
  local nb=$DEV/bin/oxccl-netbench
  if [ -x "$nb" ]; then
    test_step net "netbench default shape" 60 1 "$nb" --sizes 64K,1M,16M --total 512M --reps 5
    test_step net "netbench 2x2" 60 1 env NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=2 \
      "$nb" --sizes 64K,1M,16M --total 512M --reps 5
  fi
  # Two "machines": ranks in network namespaces of their own, with hostnames of their own,
  # joined by a veth pair, interfaces found by the libraries (scripts/two-hosts.sh; needs
  # iproute2: IP=path, else ip on PATH, else the one scripts/stage-device puts in .device).
  local ipcmd=${IP:-ip}
  command -v "$ipcmd" >/dev/null 2>&1 || ipcmd=$DEV/iproute/ipw
  if ! [ -x "$ipcmd" ] && ! command -v "$ipcmd" >/dev/null 2>&1; then
    only net "two hosts in network namespaces" &&
      row net "two hosts in network namespaces" SKIP - 0 "no iproute2 (set IP=/path/to/ip)"
  else
    test_step net "two hosts in network namespaces" 150 0 env IP="$ipcmd" OUTDIR="$OUT/two-hosts" \
      "$HERE/two-hosts.sh" "$OURS" ${NVLIB:+"$NVLIB"}
  fi
  # PyTorch DDP over the network: 2 and 4 ranks on cuda:0, each claiming its own host, ours
  # against NVIDIA's (loss curves identical at 2 ranks, within 1e-4 at 4).
  torch_all_step net "torch-hostid (DDP 2, 4 ranks vs NVIDIA)" 420 120 --hostid --steps 50
}

sec_bench() {
  local vs=()
  [ -n "$NVLIB" ] && vs=(--vs "$NVLIB")
  local one=(--lib "$OURS" ${vs[@]+"${vs[@]}"} -g 1 -c all -d float -o sum -b 8 -e 1G -f 4 --inplace both --timeout 60)
  LEAVE=150 bench_step bench "1 rank ours vs NVIDIA" 300 -- "${one[@]}" -w 20 -n 100
  if [ -s "$TMP/step.out" ] && grep -q '^# Side-by-side summary' "$TMP/step.out"; then
    awk '/^# Side-by-side summary/{on=1} on' "$TMP/step.out" >"$TMP/vs-summary.txt"
  fi
  LEAVE=100 bench_step bench "1 rank ours vs NVIDIA --graph" 240 -- "${one[@]}" --graph -w 2 -n 10
  local r
  for r in 2 4 8; do
    bench_step bench "R=$r on GPU 0 (ours, timing)" 150 env NCCL_MULTI_RANK_GPU_ENABLE=1 -- --lib "$OURS" \
      --devices "$(zeros $r)" -c all_reduce,all_gather -d float -o sum -b 8 -e 256M -f 4 --inplace 0 \
      --check 1 -w 3 -n 10 --timeout 60
  done
}

sec_copy() {
  if [ -x "$DEV/bin/shared_gpu" ] && plan copy "cudaMemcpyAsync D2D rate" 120 30; then
    runstep copy "cudaMemcpyAsync D2D rate" env LD_LIBRARY_PATH="$DEV/lib" "$DEV/bin/shared_gpu" --copy-rate
    local v=ok
    [ "$RC" = 0 ] || v="FAIL($RC)"
    [ "$RC" = 0 ] || FAILED=1
    row copy "cudaMemcpyAsync D2D rate" "$v" - "$ELAPSED" \
      "$(grep -E '^ +[0-9]+ ' "$TMP/step.out" | awk '{printf "%s%.0fMiB %.0f GB/s", sep, $1 / 1048576, $4; sep = ", "}')"
    grep -E '^(#| +[0-9])' "$TMP/step.out" | sed 's/^/      /'
  elif [ ! -x "$DEV/bin/shared_gpu" ]; then
    row copy "cudaMemcpyAsync D2D rate" SKIP - 0 "$DEV/bin/shared_gpu missing"
  fi
  local vs=()
  [ -n "$NVLIB" ] && vs=(--vs "$NVLIB")
  bench_step copy "1 rank copies: ours${NVLIB:+ vs NVIDIA}" 150 -- --lib "$OURS" ${vs[@]+"${vs[@]}"} -g 1 \
    -c all_reduce,broadcast,sendrecv -d float -o sum --sizes 1M,16M,256M,1G --inplace 0 --check 0 -w 5 -n 20 \
    --timeout 60
}

# One scripts/nccl-tests.sh run: nccl_tests_step NAME NOMINAL [VAR=VALUE...] (NT_* settings).
# Its table and summary go to percall.log and under the row; its archive to $OUT/percall/.
nccl_tests_step() {
  local name=$1 nominal=$2
  shift 2
  if [ ! -f "$DEV/nccl-tests/nccl-tests.tar.xz" ]; then
    row percall "$name" SKIP - 0 "$DEV/nccl-tests/nccl-tests.tar.xz missing (scripts/nccl-tests.sh build)"
    return 0
  fi
  plan percall "$name" "$nominal" "${LEAVE:-0}" || return 0
  local dir=$OUT/percall/${name//[^A-Za-z0-9._-]/_}
  mkdir -p "$dir"
  local libs="ours=$OURS" ref
  ref=$(ref_232_dir) && libs+=" nv2323=$ref/libnccl.so.2"
  [ -n "$NVLIB" ] && libs+=" nv2289=$NVLIB"
  runstep percall "$name" env NT_LIBS="$libs" NT_BUDGET_S=$((LIMIT - 15)) OUT="$dir" "$@" "$HERE/nccl-tests.sh" run
  local verdict
  case $RC in
    0) verdict=ok ;;
    1) verdict=FAIL ;;
    2) verdict=SKIP ;;
    *) verdict="FAIL($RC)" ;;
  esac
  case $verdict in ok | SKIP) ;; *) FAILED=1 ;; esac
  local note
  note="$(grep -cE '^ +[a-z_]+ +[a-z0-9]+ +run [0-9]+ .* ok' "$TMP/step.out") runs passed their checks"
  [ "$RC" = 2 ] && note=$(grep -m1 '^nccl-tests.sh run: ' "$TMP/step.out" | cut -c1-160)
  row percall "$name" "$verdict" - "$ELAPSED" "$note"
  awk '/^## summary/{on=1} on' "$TMP/step.out" | sed 's/^/      /'
}

sec_percall() {
  local cpus cpu
  LEAVE=60 nccl_tests_step "nccl-tests -g 1, 9 collectives" 330 NT_REPEAT=3 NT_RUN_TIMEOUT_S=20 \
    NT_ARGS="-b 8 -e 8M -f 4 -w 20 -n 200 -c 1 -d float"
  cpus=$("$HERE/gpu-cpus" 2)
  [ -n "$cpus" ] || row percall "level probe" SKIP - 0 "no CPUs of GPU 0's node found (scripts/gpu-cpus)"
  for cpu in ${cpus//,/ }; do
    LEAVE=60 nccl_tests_step "level probe, CPU $cpu alone" 40 NT_CPUS="$cpu" NT_COLLS=all_reduce NT_REPEAT=3 \
      NT_RUN_TIMEOUT_S=15 NT_ARGS="-b 8 -e 128K -f 4 -w 20 -n 200 -c 1 -d float"
  done
  hostpath_step
}

# scripts/hostpath.sh, one rank and two processes on GPU 0 (under MPS): the caller's time, the
# stream's and the process's CPU time per call, 1000 calls back to back, each library 3 runs;
# side-by-side.txt in percall/hostpath. Ours must end every run cleanly; NVIDIA's runs are the
# reference (2.28.9 refuses two ranks on one GPU).
hostpath_step() {
  local name="hostpath modes 1 and p"
  if [ ! -x "$DEV/bin/hostpath" ]; then
    row percall "$name" SKIP - 0 "$DEV/bin/hostpath missing (scripts/stage-device)"
    return 0
  fi
  if [ ! -e /dev/nvidia0 ]; then
    row percall "$name" SKIP - 0 "no NVIDIA GPU here (no /dev/nvidia0)"
    return 0
  fi
  plan percall "$name" 180 || return 0
  runstep percall "$name" env OUT="$OUT/percall/hostpath" HOSTPATH_MODES="1 p" \
    HOSTPATH_SIZES=8,32768,524288,2097152 "$HERE/hostpath.sh" 1000
  local runs bad verdict=ok
  runs=$(grep -cE '^rc=[0-9]+ ours(prof)? mode=' "$TMP/step.out")
  bad=$(grep -E '^rc=[0-9]+ ours(prof)? mode=' "$TMP/step.out" | grep -vc '^rc=0 ')
  if killed; then verdict=KILLED; elif [ "$runs" = 0 ] || [ "$bad" != 0 ]; then verdict=FAIL; fi
  [ "$verdict" = ok ] || FAILED=1
  row percall "$name" "$verdict" - "$ELAPSED" "$((runs - bad)) of oxccl's $runs runs ended with status 0"
}

# One scripts/torch-all.sh run: torch_all_step SECTION NAME NOMINAL MINIMUM TORCH-ALL-ARGS...
# (--ours, --budget and --out are added); skipped when torch is missing or less than MINIMUM
# seconds are left.
torch_all_step() {
  local sec=$1 name=$2 nominal=$3 minimum=$4
  shift 4
  only "$sec" "$name" || return 0
  if ! timeout 120 python3 -c 'import torch' >/dev/null 2>&1; then
    row "$sec" "$name" SKIP - 0 "python3 cannot import torch"
    return 0
  fi
  plan "$sec" "$name" "$nominal" || return 0
  local lim=$LIMIT dir=$TMP/torch-$sec
  if [ "$lim" -lt "$minimum" ]; then
    row "$sec" "$name" SKIP - 0 "time budget: ${lim} s (needs $minimum)"
    return 0
  fi
  rm -rf "$dir"
  runstep "$sec" "$name" "$HERE/torch-all.sh" "$@" --ours "$OURS" --budget $((lim - 30)) --out "$dir"
  {
    echo "######## torch-all.log"
    cat "$dir/torch-all.log" 2>/dev/null
    echo "######## torch-all summary.txt"
    cat "$dir/summary.txt" 2>/dev/null
  } >>"$OUT/$sec.log"
  local line ref verdict
  line=$(grep -E '^torch-all: [0-9]+ passed' "$dir/summary.txt" 2>/dev/null | tail -1)
  ref=$(grep -m1 '^reference suite-nvidia' "$dir/summary.txt" 2>/dev/null | cut -c1-160)
  if [ "$RC" = 0 ]; then verdict=ok; elif killed; then verdict=KILLED; else verdict=FAIL; fi
  [ "$verdict" = ok ] || FAILED=1
  row "$sec" "$name" "$verdict" - "$ELAPSED" "${line:-no summary line}${ref:+; $ref}"
  grep -E '^(PASS|FAIL|SKIP|reference) ' "$dir/summary.txt" 2>/dev/null | cut -c1-200 | sed 's/^/      /'
}

sec_torch() {
  torch_all_step torch "torch-all --same-gpu --gpus 4" 600 90 --same-gpu --gpus 4 --steps 200
}

for ((si = 0; si < ${#SECTIONS[@]}; si++)); do
  sec=${SECTIONS[$si]}
  if [ $((END - RESERVE - SECONDS)) -lt 20 ]; then
    row "$sec" "(section)" SKIP - 0 "time budget"
    continue
  fi
  section_begin "$sec" "$si"
  "sec_$sec"
done

# ---- summary
{
  echo "one-gpu-suite: sections ${SECTIONS[*]}, budget ${BUDGET} s, ran $(elapsed) s"
  echo "ours: $OURS; NVIDIA: ${NVLIB:-not found}"
  if [[ " ${SECTIONS[*]} " == *" matrix "* || " ${SECTIONS[*]} " == *" net "* ]]; then
    unknown=""
    [ "$MATRIX_UNKNOWN" -gt 0 ] && unknown=" (+ $MATRIX_UNKNOWN runs that wrote no records)"
    echo "matrix: $MATRIX_RUNS runs, wrong elements in total: $MATRIX_WRONG$unknown, WRONG lines: $MATRIX_WRONG_LINES"
  fi
  if [ -s "$TMP/vs-summary.txt" ]; then
    echo
    echo "side by side, 1 rank (A = ours, B = NVIDIA):"
    head -n 60 "$TMP/vs-summary.txt"
  fi
  echo
  printf '%-6s %-34s %-10s %9s %5s  %s\n' section step verdict wrong s note
  printf '%s\n' "${ROWS[@]}"
  echo
  if [ "$FAILED" = 0 ]; then echo "one-gpu-suite: no step failed"; else echo "one-gpu-suite: SOME STEPS FAILED (see the logs)"; fi
} >"$SUMMARY"
# Keep every file under 16 MiB: the head and the tail of a longer one.
for f in "$OUT"/*; do
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f" 2>/dev/null || echo 0)
  if [ "$size" -gt 16000000 ]; then
    { head -c 2000000 "$f"; printf '\n\n######## [cut: %s bytes in all]\n\n' "$size"; tail -c 13000000 "$f"; } >"$TMP/cut" && mv -f "$TMP/cut" "$f"
  fi
done
# Every log (and the folders of api232, two-hosts, ...) into one archive beside summary.txt:
# a device call returns only a few files.
# Only what this run wrote is packed and removed (OUT may hold other things).
wrote=(machine.log)
for s in "${SECTIONS[@]}"; do wrote+=("$s.log"); done
for d in api232 two-hosts percall; do [ -e "$OUT/$d" ] && wrote+=("$d"); done
if (cd "$OUT" && tar -czf "$TMP/one-gpu-suite.tar.gz" "${wrote[@]}" && rm -rf "${wrote[@]}" &&
  mv "$TMP/one-gpu-suite.tar.gz" .); then
  echo "logs: $OUT/one-gpu-suite.tar.gz" >>"$SUMMARY"
fi
echo
echo "==== summary"
cat "$SUMMARY"
[ "$FAILED" = 0 ]
