#!/usr/bin/env bash
# PyTorch on oxccl: the one driver. Run from anywhere on the GPU machine, with the
# python3 of a torch venv first on PATH (or PYTHON=/path/python3). See docs/torch.md.
#
# usage: scripts/torch-all.sh --ours PATH/libnccl.so.2 [--gpus N] [--out DIR] [--steps S]
#                             [--no-reference] [--same-gpu | --hostid] [--budget S]
#   --ours PATH      our library (required)
#   --gpus N         ranks per torchrun (default: all GPUs, with --same-gpu 4; the fault
#                    scenarios always use 2)
#   --out DIR        where the logs go (default ./out-torch): torch-all.log (every step's
#                    output), summary.txt, ours.json and nvidia.json (--hostid: ours-hostid-N.json
#                    and nvidia-hostid-N.json for each N instead)
#   --steps S        DDP steps of the two comparison runs (default 200)
#   --no-reference   skip the fault scenarios under NVIDIA's library (reference lines)
#   --same-gpu       every rank on cuda:0 (one GPU is enough): exports
#                    NCCL_MULTI_RANK_GPU_ENABLE=1, runs torch-suite.py with --same-gpu (no
#                    --symm) and the fault scenarios with LOCAL_RANK=0 in every rank. NVIDIA's
#                    NCCL 2.28 refuses ranks sharing a GPU ("Duplicate GPU detected"): suite-nvidia
#                    becomes a reference line recording that refusal, compare is skipped (no
#                    reference loss curve); neither counts as a failure. Items run in the
#                    order suite, faults (ours), nonblocking, bindings, replaced-file, faults (NVIDIA)
#   --hostid         only the DDP comparison over the network: every rank on cuda:0 and claiming a
#                    host of its own (torch-suite.py --hostid: each worker sets
#                    NCCL_HOSTID=torch-hostid-<rank> and NCCL_SOCKET_IFNAME=lo before
#                    init_process_group), so both libraries connect the ranks over their socket
#                    network (NVIDIA's accepts this: no two ranks share a host). For N = 2 and 4
#                    ranks (--gpus N: that N only): suite-ours-hostid-N, suite-nvidia-hostid-N and
#                    compare-hostid-N, whose loss curves must be bitwise identical at 2 ranks (a
#                    sum of two is the same in any order) and within 1e-4 at more
#   --budget S       stop starting items when fewer than ~45 s of S seconds are left (they are
#                    reported as "SKIP ... time budget", not counted) and cap every step's
#                    limit to what is left
#   --items LIST     only these items, in the usual order: a comma list of bindings suite
#                    nonblocking replaced faults faults_nvidia (e.g. --items faults,faults_nvidia)
# Items (one PASS/FAIL line each, then a summary line; exit 0 iff every item passed):
#   a bindings          LD_PRELOAD=ours: every nccl*/pnccl* symbol of torch's libraries binds to ours
#   b suite-ours, suite-nvidia, compare
#                       torch-suite.py (with --symm) under ours and under NVIDIA's library; the
#                       DDP loss curves must agree, step times are printed
#   c nonblocking       torch-suite.py under ours with TORCH_NCCL_USE_COMM_NONBLOCKING=1
#   d replaced-file     ours copied over NVIDIA's libnccl.so.2 in the nvidia.nccl package (restored
#                       by a trap on every exit path), no LD_PRELOAD: bindings + a short suite run;
#                       the original must be back byte for byte (cmp)
#   e fault-abort, fault-watchdog, fault-kill, fault-hang-report
#                       scripts/torch-faults.py under ours (and under NVIDIA's as "reference"):
#                       kill = a rank SIGKILLed mid-training (DDP), the survivor's error names it
#                       within 20 s; hang-report = a rank skips an all_reduce, our hang report
#                       (OXCCL_HANG_REPORT_S=5) names it before torch's 30 s timeout
#   f suite-ours-hostid-N, suite-nvidia-hostid-N, compare-hostid-N
#                       --hostid only (and then only these): see --hostid above
set -u -o pipefail

OURS=""
GPUS=""
OUT=./out-torch
STEPS=200
REFERENCE=1
SAME_GPU=0
HOSTID=0
BUDGET=""
ITEMS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ours) OURS="${2:-}"; shift ;;
    --gpus) GPUS="${2:-}"; shift ;;
    --out) OUT="${2:-}"; shift ;;
    --steps) STEPS="${2:-}"; shift ;;
    --no-reference) REFERENCE=0 ;;
    --same-gpu) SAME_GPU=1 ;;
    --hostid) HOSTID=1 ;;
    --budget) BUDGET="${2:-}"; shift ;;
    --items) ITEMS="${2:-}"; shift ;;
    -h|--help) sed -n '2,50p' "$0"; exit 0 ;;
    *) echo "torch-all: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$OURS" ] || { echo "torch-all: --ours PATH/libnccl.so.2 is required" >&2; exit 2; }
for it in ${ITEMS//,/ }; do
  case "$it" in
    bindings | suite | nonblocking | replaced | faults | faults_nvidia | hostid) ;;
    *) echo "torch-all: unknown item '$it' in --items (bindings suite nonblocking replaced faults faults_nvidia hostid)" >&2; exit 2 ;;
  esac
done
case "$BUDGET" in
  "" | *[!0-9]*) [ -z "$BUDGET" ] || { echo "torch-all: --budget needs seconds, got '$BUDGET'" >&2; exit 2; } ;;
esac
[ -f "$OURS" ] || { echo "torch-all: --ours $OURS: no such file" >&2; exit 2; }
[ "$SAME_GPU" = 1 ] && [ "$HOSTID" = 1 ] && { echo "torch-all: --same-gpu and --hostid exclude each other" >&2; exit 2; }
OURS=$(readlink -f "$OURS")

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# Every rank of these runs is on this machine: bootstrap and sockets over loopback only.
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
unset LD_PRELOAD
# --same-gpu: the suite's extra arguments, the suite's --symm (not with --same-gpu), and the
# fault scenarios' command prefix (torchrun runs "env LOCAL_RANK=0 python3 torch-faults.py").
SAME=()
SYMM=(--symm)
if [ "$SAME_GPU" = 1 ]; then
  SAME=(--same-gpu)
  SYMM=()
  export NCCL_MULTI_RANK_GPU_ENABLE=1
fi
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
SUITE=$HERE/torch-suite.py
FAULTS=$HERE/torch-faults.py
mkdir -p "$OUT" || { echo "torch-all: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/torch-all.log
SUMMARY=$OUT/summary.txt
: >"$LOG"
: >"$SUMMARY"
rm -f "$OUT/ours.json" "$OUT/nvidia.json" "$OUT"/ours-hostid-*.json "$OUT"/nvidia-hostid-*.json
WORK=$(mktemp -d /tmp/torch-all.XXXXXX)
START=$SECONDS
PASSED=0
FAILED=0
SKIPPED=0
FAILS=()

say() { echo "$*" | tee -a "$LOG"; }
pass() { PASSED=$((PASSED + 1)); say "PASS $1${2:+ ($2)}"; echo "PASS $1${2:+ ($2)}" >>"$SUMMARY"; }
fail() { FAILED=$((FAILED + 1)); FAILS+=("$1"); say "FAIL $1: $2"; echo "FAIL $1: $2" >>"$SUMMARY"; }
reference() { say "reference $1: $2 (not counted)"; echo "reference $1: $2 (not counted)" >>"$SUMMARY"; }
skip() { SKIPPED=$((SKIPPED + 1)); say "SKIP $1: $2 (not counted)"; echo "SKIP $1: $2 (not counted)" >>"$SUMMARY"; }
left() { # seconds of the --budget still left (a large number without --budget)
  if [ -n "$BUDGET" ]; then echo $((BUDGET - (SECONDS - START))); else echo 1000000; fi
}
budget_ok() { # NAME: 0 when there is time for another item, else reports it skipped
  local l
  l=$(left)
  [ "$l" -ge 45 ] && return 0
  skip "$1" "time budget: ${l} s of ${BUDGET} s left"
  return 1
}
refusal() { # NAME: NVIDIA's refusal of a shared GPU from a run's output, if any (2.28:
  # "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device ...")
  grep -m1 -oE '(Duplicate GPU detected|Multiple Ranks are using the same GPU)[^"]{0,120}' "$WORK/$1.out" 2>/dev/null
}
# The replaced-file item writes into NVIDIA's package; BACKUP holds the original meanwhile.
NVDIR=""
NVLIB=""
BACKUP=""
REPLACED=0
restore_nvidia() {
  [ "$REPLACED" = 1 ] || return 0
  if cp -p "$BACKUP" "$NVLIB.torch-all-tmp" && mv -f "$NVLIB.torch-all-tmp" "$NVLIB" && cmp -s "$BACKUP" "$NVLIB"; then
    REPLACED=0
    rm -f "$BACKUP"
    say "restored NVIDIA's $NVLIB"
  else
    say "!!! could not restore $NVLIB: copy $BACKUP over it by hand"
    return 1
  fi
}
CHILD=""
stop_child() { # the running step, if any: timeout passes the signal on to its command
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null && sleep 2
  CHILD=""
}
on_exit() {
  stop_child
  restore_nvidia
  rm -rf "$WORK"
}
trap on_exit EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM
trap 'say "hangup"; exit 129' HUP

# run NAME LIMIT CMD...: CMD under timeout, output in $WORK/NAME.out and appended to the log.
# Sets RC and ELAPSED. After a timeout, kills the rank processes the run announced by pid.
run() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS l
  l=$(left)
  if [ "$limit" -gt $((l - 10)) ]; then limit=$((l - 10)); fi
  [ "$limit" -ge 20 ] || limit=20
  {
    echo
    echo "===== $name (limit ${limit} s): $*"
  } >>"$LOG"
  # In the background and waited for, so that a signal to this script runs its trap at once.
  timeout -k 10 "$limit" "$@" >"$WORK/$name.out" 2>&1 &
  CHILD=$!
  wait "$CHILD"
  RC=$?
  CHILD=""
  ELAPSED=$((SECONDS - t0))
  cat "$WORK/$name.out" >>"$LOG"
  echo "===== $name: exit $RC after ${ELAPSED} s" >>"$LOG"
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    local pid
    for pid in $(grep -oE '\] pid [0-9]+' "$WORK/$name.out" | awk '{print $3}'); do
      if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qE 'torch-(suite|faults)\.py'; then
        kill -9 "$pid" 2>/dev/null && say "  killed leftover rank process $pid"
      fi
    done
  fi
}

why() { # a one-line reason from a run's output
  local out=$WORK/$1.out
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    echo "timed out after ${ELAPSED} s; last line: $(grep -v '^\s*$' "$out" | tail -1 | cut -c1-200)"
  elif grep -q '^FAIL ' "$out"; then
    echo "exit $RC; $(grep '^FAIL ' "$out" | head -3 | cut -c1-200 | paste -sd ';' -)"
  else
    echo "exit $RC; last line: $(grep -v '^\s*$' "$out" | tail -1 | cut -c1-200)"
  fi
}

suite_ok() { # NAME: the suite ran to its summary with no failure
  [ "$RC" = 0 ] && grep -qE '^[0-9]+ passed, 0 failed' "$WORK/$1.out"
}

TORCHRUN=("$PY" -m torch.distributed.run --standalone)

# ---- environment
PHYS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "${PHYS:-0}" -gt 0 ] || PHYS=$(timeout 120 "$PY" -c 'import torch; print(torch.cuda.device_count())' 2>>"$LOG")
HOSTID_RANKS="2 4"
[ "$HOSTID" = 1 ] && [ -n "$GPUS" ] && HOSTID_RANKS=$GPUS
if [ -z "$GPUS" ]; then
  GPUS=$PHYS
  [ "$SAME_GPU" = 1 ] && GPUS=4
  [ "$HOSTID" = 1 ] && GPUS=${HOSTID_RANKS##* }
fi
NVDIR=$(timeout 60 "$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>>"$LOG")
NVLIB=$NVDIR/libnccl.so.2
BACKUP=$NVLIB.torch-all-backup
TORCHV=$(timeout 120 "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())' 2>>"$LOG")
say "torch-all: ours=$OURS gpus=$GPUS steps=$STEPS out=$OUT${BUDGET:+ budget=${BUDGET}s}"
[ "$SAME_GPU" = 1 ] && say "same-gpu: all $GPUS ranks of every torchrun on cuda:0, NCCL_MULTI_RANK_GPU_ENABLE=1"
[ "$HOSTID" = 1 ] && say "hostid: $HOSTID_RANKS ranks on cuda:0, each claiming its own host (NCCL_HOSTID), over the socket network on lo"
say "torch: ${TORCHV:-not importable}; NVIDIA NCCL: ${NVLIB}"
{ nvidia-smi -L; "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-nccl)'; } >>"$LOG" 2>&1
if [ -z "$TORCHV" ]; then
  fail setup "python3 ($PY) cannot import torch"
  exit 1
fi
if [ -z "$NVDIR" ] || [ ! -f "$NVLIB" ]; then
  fail setup "NVIDIA's libnccl.so.2 not found via the nvidia.nccl package"
  exit 1
fi
if [ "$SAME_GPU" = 1 ] || [ "$HOSTID" = 1 ]; then
  if [ "${PHYS:-0}" -lt 1 ] || [ "${GPUS:-0}" -lt 2 ]; then
    fail setup "--same-gpu and --hostid need a GPU (found ${PHYS:-0}) and at least 2 ranks (--gpus ${GPUS:-0})"
    exit 1
  fi
elif [ "${GPUS:-0}" -lt 2 ]; then
  fail setup "need at least 2 GPUs, found ${GPUS:-0}"
  exit 1
fi
# A run killed before its trap could restore NVIDIA's file leaves the backup behind.
if [ -f "$BACKUP" ]; then
  say "found $BACKUP from an interrupted run: restoring it first"
  REPLACED=1
  restore_nvidia || exit 1
fi
if cmp -s "$OURS" "$NVLIB"; then
  fail setup "$NVLIB is identical to ours: NVIDIA's original is gone (reinstall nvidia-nccl)"
  exit 1
fi

bindings_item() { # NAME EXPECTED-LIB LD_DEBUG-DIR
  local name=$1 expect=$2 dir=$3
  "$PY" "$SUITE" --bindings-report "$dir" --expect "$expect" >"$WORK/$name-report.out" 2>&1
  local rrc=$?
  cat "$WORK/$name-report.out" >>"$LOG"
  grep -E '^(PASS|FAIL|  ELSEWHERE)' "$WORK/$name-report.out"
  if [ "$rrc" = 0 ]; then
    pass "$name" "$(grep -oE 'all [0-9]+ bound' "$WORK/$name-report.out")"
  else
    fail "$name" "$(grep -E '^FAIL' "$WORK/$name-report.out" | head -1 | cut -c6-300)"
  fi
  rm -rf "$dir"
}

# ---- a. bindings under LD_PRELOAD
item_bindings() {
  if budget_ok bindings; then
    mkdir -p "$WORK/ld-a"
    run bindings-run 150 env LD_PRELOAD="$OURS" LD_DEBUG=bindings LD_DEBUG_OUTPUT="$WORK/ld-a/ld" \
      "${TORCHRUN[@]}" --nproc-per-node 2 "$SUITE" --steps 5 ${SAME[@]+"${SAME[@]}"}
    if suite_ok bindings-run; then
      bindings_item bindings "$OURS" "$WORK/ld-a"
    else
      fail bindings "the traced run failed: $(why bindings-run)"
      rm -rf "$WORK/ld-a"
    fi
  fi
}

# ---- b. suite under ours and under NVIDIA's, then the comparison
item_suite() {
  if budget_ok suite-ours; then
    run suite-ours 200 env LD_PRELOAD="$OURS" "${TORCHRUN[@]}" --nproc-per-node "$GPUS" "$SUITE" \
      --steps "$STEPS" ${SYMM[@]+"${SYMM[@]}"} ${SAME[@]+"${SAME[@]}"} --out "$OUT/ours.json"
    grep -E '^(PASS|FAIL|SKIP|    SYMM|    same-gpu|same-gpu|DDP step|[0-9]+ passed)' "$WORK/suite-ours.out"
    if suite_ok suite-ours; then pass suite-ours "$(grep -E '^[0-9]+ passed' "$WORK/suite-ours.out")"; else fail suite-ours "$(why suite-ours)"; fi
  fi

  if [ "$SAME_GPU" = 1 ]; then
    # NVIDIA's 2.28 refuses ranks sharing a GPU: a short run records the refusal.
    if budget_ok suite-nvidia; then
      run suite-nvidia 120 "${TORCHRUN[@]}" --nproc-per-node "$GPUS" "$SUITE" --steps 5 "${SAME[@]}"
      line=$(refusal suite-nvidia)
      if [ -n "$line" ] && [ "$RC" != 0 ]; then
        reference suite-nvidia "refuses ranks sharing a GPU, as expected: $line"
      elif suite_ok suite-nvidia; then
        reference suite-nvidia "accepted $GPUS ranks on one GPU (a 2.30 or later NVIDIA library honours NCCL_MULTI_RANK_GPU_ENABLE=1): $(grep -E '^[0-9]+ passed' "$WORK/suite-nvidia.out")"
      else
        reference suite-nvidia "UNEXPECTED: failed without a shared-GPU refusal message: $(why suite-nvidia)"
      fi
    fi
    skip compare "--same-gpu: NVIDIA's library refuses shared GPUs, so there is no reference loss curve"
  elif budget_ok suite-nvidia; then
    run suite-nvidia 200 "${TORCHRUN[@]}" --nproc-per-node "$GPUS" "$SUITE" \
      --steps "$STEPS" --symm --out "$OUT/nvidia.json"
    grep -E '^(FAIL|    SYMM|DDP step|[0-9]+ passed)' "$WORK/suite-nvidia.out"
    if suite_ok suite-nvidia; then pass suite-nvidia "$(grep -E '^[0-9]+ passed' "$WORK/suite-nvidia.out")"; else fail suite-nvidia "$(why suite-nvidia)"; fi
  fi

  if [ "$SAME_GPU" = 1 ]; then
    :
  elif [ -f "$OUT/ours.json" ] && [ -f "$OUT/nvidia.json" ]; then
    run compare 30 "$PY" "$SUITE" --compare "$OUT/nvidia.json" "$OUT/ours.json"
    cat "$WORK/compare.out"
    if [ "$RC" = 0 ]; then
      pass compare "$(grep -o 'ratio [0-9.]*' "$WORK/compare.out" | sed 's/ratio/step time nvidia\/ours/')"
    else
      fail compare "$(head -1 "$WORK/compare.out")"
    fi
  else
    fail compare "a suite run wrote no loss json"
  fi
}

# ---- c. non-blocking communicators
item_nonblocking() {
  if budget_ok nonblocking; then
    run nonblocking 180 env LD_PRELOAD="$OURS" TORCH_NCCL_USE_COMM_NONBLOCKING=1 TORCH_CPP_LOG_LEVEL=INFO \
      "${TORCHRUN[@]}" --nproc-per-node "$GPUS" "$SUITE" --steps 50 --nonblocking ${SAME[@]+"${SAME[@]}"}
    grep -E '^(FAIL|TORCH_NCCL_USE|PASS communicators|[0-9]+ passed)' "$WORK/nonblocking.out"
    if suite_ok nonblocking; then pass nonblocking "$(grep -E '^[0-9]+ passed' "$WORK/nonblocking.out")"; else fail nonblocking "$(why nonblocking)"; fi
  fi
}

# ---- d. ours in place of NVIDIA's file, no LD_PRELOAD
item_replaced() {
  d_ok=1
  d_why=""
  if ! budget_ok replaced-file; then
    d_ok=skipped
  elif cp -p "$NVLIB" "$BACKUP" && cmp -s "$NVLIB" "$BACKUP"; then
    REPLACED=1
    if cp "$OURS" "$NVLIB.torch-all-tmp" && chmod --reference="$BACKUP" "$NVLIB.torch-all-tmp" &&
      mv -f "$NVLIB.torch-all-tmp" "$NVLIB" && cmp -s "$OURS" "$NVLIB"; then
      say "replaced $NVLIB with ours (original in $BACKUP)"
      mkdir -p "$WORK/ld-d"
      run replaced-run 180 env -u LD_PRELOAD LD_DEBUG=bindings LD_DEBUG_OUTPUT="$WORK/ld-d/ld" \
        "${TORCHRUN[@]}" --nproc-per-node "$GPUS" "$SUITE" --steps 20 ${SAME[@]+"${SAME[@]}"}
      grep -E '^(FAIL|[0-9]+ passed)' "$WORK/replaced-run.out"
      if suite_ok replaced-run; then
        "$PY" "$SUITE" --bindings-report "$WORK/ld-d" --expect "$NVLIB" >"$WORK/replaced-report.out" 2>&1
        rrc=$?
        cat "$WORK/replaced-report.out" >>"$LOG"
        grep -E '^(PASS|FAIL|  ELSEWHERE)' "$WORK/replaced-report.out"
        if [ "$rrc" != 0 ]; then
          d_ok=0
          d_why="bindings: $(grep -E '^FAIL' "$WORK/replaced-report.out" | head -1 | cut -c6-300)"
        fi
      else
        d_ok=0
        d_why="suite: $(why replaced-run)"
      fi
      cmp -s "$OURS" "$NVLIB" || { d_ok=0; d_why="$d_why; the file changed under the run"; }
      rm -rf "$WORK/ld-d"
    else
      d_ok=0
      d_why="could not put ours in place of $NVLIB"
    fi
    if ! restore_nvidia; then
      d_ok=0
      d_why="$d_why; RESTORE FAILED"
    elif cmp -s "$OURS" "$NVLIB"; then
      d_ok=0
      d_why="$d_why; NVIDIA's file still holds ours after the restore"
    fi
  else
    d_ok=0
    d_why="cannot back up $NVLIB to $BACKUP"
    rm -f "$BACKUP"
  fi
  if [ "$d_ok" = skipped ]; then
    :
  elif [ "$d_ok" = 1 ]; then pass replaced-file "suite, bindings, original restored (cmp)"; else fail replaced-file "${d_why#; }"; fi
}

# ---- e. fault scenarios
judge_abort() { # NAME -> prints "ok|<reason>"
  local out=$WORK/$1.out
  local line
  line=$(grep -E '^FAULT-ABORT (released|FAIL)' "$out" | head -1)
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    echo "timed out after ${ELAPSED} s; ${line:-no marker line}"
  elif [ "$RC" != 0 ]; then
    echo "exit $RC; ${line:-$(why "$1")}"
  elif [[ "$line" =~ ^FAULT-ABORT\ released\ after\ ([0-9]+)\.[0-9]+\ s ]] && [ "${BASH_REMATCH[1]}" -lt 30 ]; then
    echo "ok ${line#FAULT-ABORT }"
  else
    echo "${line:-no 'released' marker}"
  fi
}
judge_watchdog() {
  local out=$WORK/$1.out
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    echo "timed out after ${ELAPSED} s: the watchdog did not end the run"
  elif grep -q '^FAULT-WATCHDOG FAIL' "$out"; then
    grep '^FAULT-WATCHDOG FAIL' "$out" | head -1
  elif [ "$RC" = 0 ]; then
    echo "the run ended with exit 0: no teardown"
  elif ! grep -qE 'Watchdog caught collective operation timeout|milliseconds before timing out' "$out"; then
    echo "exit $RC after ${ELAPSED} s but no watchdog timeout message in the log"
  elif [ "$ELAPSED" -gt 90 ]; then
    echo "took ${ELAPSED} s (limit 90)"
  else
    echo "ok torn down after ${ELAPSED} s, exit $RC, with the timeout message"
  fi
}
judge_kill() { # the survivor's error names the dead rank within 20 s of the kill, no hang
  local out=$WORK/$1.out line pid1 secs alive
  pid1=$(grep -m1 -oE '^\[rank 1\] pid [0-9]+' "$out" | awk '{print $4}')
  line=$(grep -m1 -E '^FAULT-KILL (raised|FAIL)' "$out")
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    echo "timed out after ${ELAPSED} s; ${line:-no marker line}"
  elif [[ "$line" =~ ^FAULT-KILL\ raised\ after\ ([0-9]+)\.[0-9]+\ s\ \((names|does\ not\ name)\ rank\ 1 ]]; then
    secs=${BASH_REMATCH[1]}
    if [ "$secs" -gt 20 ]; then
      echo "the error took ${secs} s (limit 20): $line"
    elif [ "${BASH_REMATCH[2]}" = names ]; then
      echo "ok ${line#FAULT-KILL }"
    elif [ -n "$pid1" ] && grep -qE "rank 1 \(host [^,]*, pid $pid1, .*is gone" "$out"; then
      # Torch's exception text left the library's message out; its WARN line has it.
      echo "ok ${line#FAULT-KILL } (our WARN line in the log names rank 1)"
    else
      echo "raised in time, but nothing names rank 1${pid1:+ (pid $pid1)}: $line"
    fi
  elif [ -n "$line" ]; then
    echo "$line"
  elif [ -n "$pid1" ] && grep -qE "rank 1 \(host [^,]*, pid $pid1, .*is gone" "$out" &&
    grep -qE 'ncclRemoteError|remote process exited|DistBackendError|watchdog thread terminated' "$out"; then
    # Torch's error handling (its watchdog) took rank 0 down first, with the library's error:
    # the last heartbeat bounds when.
    alive=$(grep -oE '^FAULT-KILL rank 0 alive [0-9]+' "$out" | tail -1 | awk '{print $5}')
    if [ "${alive:-99}" -le 20 ]; then
      echo "ok torn down by torch's error handling within $((alive + 1)) s of the kill, with our message: $(grep -m1 -oE "rank 1 \(host [^,]*, pid $pid1, [^)]*\) is gone[^\"]{0,80}" "$out")"
    else
      echo "torn down, but ${alive:-no} heartbeat(s) say it took more than 20 s"
    fi
  else
    echo "exit $RC after ${ELAPSED} s: no error naming rank 1${pid1:+ (pid $pid1)}; last line: $(grep -v '^\s*$' "$out" | tail -1 | cut -c1-200)"
  fi
}
judge_hang_report() { # our report names the laggard before torch's timeout
  local out=$WORK/$1.out line
  line=$(grep -m1 -E '^FAULT-HANG-REPORT (report|FAIL)' "$out")
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    echo "timed out after ${ELAPSED} s; ${line:-no marker line}"
  elif [[ "$line" =~ ^FAULT-HANG-REPORT\ report\ after\ ([0-9]+)\.[0-9]\ s\ \(torch.s\ timeout:\ ([0-9]+)\ s\;\ names\ rank\ 1 ]] &&
    [ "${BASH_REMATCH[1]}" -lt "${BASH_REMATCH[2]}" ]; then
    local behind=""
    grep -q '^FAULT-HANG-REPORT rank 1 logged:' "$out" && behind="; rank 1 logged why"
    echo "ok ${line#FAULT-HANG-REPORT }$behind" | cut -c1-600
  else
    echo "${line:-exit $RC: no marker line}"
  fi
}
fault() { # LABEL(ours|nvidia) SCENARIO
  local lib=$1 scen=$2 name="fault-$2"
  local pre=() script=("$FAULTS") extra=()
  [ "$lib" = ours ] && pre=(env LD_PRELOAD="$OURS")
  [ "$lib" = nvidia ] && name="$name-nvidia"
  budget_ok "$name" || return 0
  # --same-gpu: torch-faults.py takes its device from LOCAL_RANK; every rank gets 0.
  [ "$SAME_GPU" = 1 ] && script=(--no-python env LOCAL_RANK=0 "$PY" "$FAULTS")
  # kill: torchrun's agent stops the surviving worker once it sees one die; seeing it only
  # every 30 s leaves the survivor's own error handling its chance (a dead rank on another
  # node is not seen by this node's agent either).
  [ "$scen" = kill ] && extra=(--monitor-interval 30)
  run "$name" 120 ${pre[@]+"${pre[@]}"} "${TORCHRUN[@]}" --nproc-per-node 2 ${extra[@]+"${extra[@]}"} \
    "${script[@]}" "$scen"
  grep -E '^FAULT-' "$WORK/$name.out" | grep -v ' alive ' | cut -c1-400
  local verdict
  case "$scen" in
    abort) verdict=$(judge_abort "$name") ;;
    watchdog) verdict=$(judge_watchdog "$name") ;;
    kill) verdict=$(judge_kill "$name") ;;
    *) verdict=$(judge_hang_report "$name") ;;
  esac
  if [ "$lib" = nvidia ]; then
    local line
    line=$(refusal "$name")
    [ "$SAME_GPU" = 1 ] && [ -n "$line" ] && verdict="refuses ranks sharing a GPU, as expected: $line"
    reference "$name" "$verdict"
  elif [ "${verdict%% *}" = ok ]; then
    pass "$name" "${verdict#ok }"
  else
    fail "$name" "$verdict"
  fi
}
item_faults() {
  fault ours abort
  fault ours watchdog
  fault ours kill
  fault ours hang-report
}
item_faults_nvidia() {
  if [ "$REFERENCE" = 1 ]; then
    fault nvidia abort
    fault nvidia watchdog
    fault nvidia kill
    fault nvidia hang-report
  fi
}

# ---- f. --hostid: the DDP comparison over the socket network, every rank its own host
item_hostid() {
  local n tol ours nv
  for n in $HOSTID_RANKS; do
    ours=$OUT/ours-hostid-$n.json
    nv=$OUT/nvidia-hostid-$n.json
    tol=1e-4
    [ "$n" = 2 ] && tol=0
    if budget_ok "suite-ours-hostid-$n"; then
      run "suite-ours-hostid-$n" 240 env LD_PRELOAD="$OURS" "${TORCHRUN[@]}" --nproc-per-node "$n" "$SUITE" \
        --steps "$STEPS" --hostid --out "$ours"
      grep -E '^(PASS|FAIL|SKIP|hostid|    same-gpu|DDP step|[0-9]+ passed)' "$WORK/suite-ours-hostid-$n.out"
      if suite_ok "suite-ours-hostid-$n"; then
        pass "suite-ours-hostid-$n" "$(grep -E '^[0-9]+ passed' "$WORK/suite-ours-hostid-$n.out")"
      else
        fail "suite-ours-hostid-$n" "$(why "suite-ours-hostid-$n")"
      fi
    fi
    if budget_ok "suite-nvidia-hostid-$n"; then
      run "suite-nvidia-hostid-$n" 240 "${TORCHRUN[@]}" --nproc-per-node "$n" "$SUITE" \
        --steps "$STEPS" --hostid --out "$nv"
      grep -E '^(FAIL|DDP step|[0-9]+ passed)' "$WORK/suite-nvidia-hostid-$n.out"
      if suite_ok "suite-nvidia-hostid-$n"; then
        pass "suite-nvidia-hostid-$n" "$(grep -E '^[0-9]+ passed' "$WORK/suite-nvidia-hostid-$n.out")"
      else
        fail "suite-nvidia-hostid-$n" "$(why "suite-nvidia-hostid-$n")"
      fi
    fi
    if [ -f "$ours" ] && [ -f "$nv" ]; then
      run "compare-hostid-$n" 30 "$PY" "$SUITE" --compare "$nv" "$ours" --tol "$tol"
      cat "$WORK/compare-hostid-$n.out"
      if [ "$RC" = 0 ]; then
        pass "compare-hostid-$n" "$(head -1 "$WORK/compare-hostid-$n.out" | sed 's/^loss curves: //; s/: PASS$//'); $(grep -o 'ratio [0-9.]*' "$WORK/compare-hostid-$n.out" | sed 's/ratio/step time nvidia\/ours/')"
      else
        fail "compare-hostid-$n" "$(head -1 "$WORK/compare-hostid-$n.out")"
      fi
    elif [ "$(left)" -ge 45 ]; then
      fail "compare-hostid-$n" "a suite run wrote no loss json"
    else
      skip "compare-hostid-$n" "time budget: a suite run did not happen"
    fi
  done
}

# The order: by default the one above; with --same-gpu (and so usually a --budget on one GPU)
# the most telling items first; --hostid runs its comparison only.
if [ "$HOSTID" = 1 ]; then
  ORDER="hostid"
elif [ "$SAME_GPU" = 1 ]; then
  ORDER="suite faults nonblocking bindings replaced faults_nvidia"
else
  ORDER="bindings suite nonblocking replaced faults faults_nvidia"
fi
for item in $ORDER; do
  if [ -n "$ITEMS" ] && ! [[ ",$ITEMS," == *",$item,"* ]]; then continue; fi
  "item_$item"
done

say ""
NOTRUN=""
[ "$SKIPPED" -gt 0 ] && NOTRUN=", $SKIPPED skipped"
say "torch-all: $PASSED passed, $FAILED failed$NOTRUN in $((SECONDS - START)) s${FAILS[*]:+ (failed: ${FAILS[*]})}"
echo "torch-all: $PASSED passed, $FAILED failed$NOTRUN in $((SECONDS - START)) s" >>"$SUMMARY"
[ "$FAILED" = 0 ]
