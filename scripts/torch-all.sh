#!/usr/bin/env bash
# PyTorch on oxccl (issue #6): the one driver. Run from anywhere on the GPU machine, with the
# python3 of a torch venv first on PATH (or PYTHON=/path/python3). See docs/torch.md.
#
# usage: scripts/torch-all.sh --ours PATH/libnccl.so.2 [--gpus N] [--out DIR] [--steps S]
#                             [--no-reference]
#   --ours PATH      our library (required)
#   --gpus N         ranks per torchrun (default: all GPUs; the fault scenarios always use 2)
#   --out DIR        where the logs go (default ./out-torch); at most 4 files:
#                    torch-all.log (every step's output), summary.txt, ours.json, nvidia.json
#   --steps S        DDP steps of the two comparison runs (default 200)
#   --no-reference   skip the fault scenarios under NVIDIA's library (reference lines)
# Items (one PASS/FAIL line each, then a summary line; exit 0 iff every item passed):
#   a bindings          LD_PRELOAD=ours: every nccl*/pnccl* symbol of torch's libraries binds to ours
#   b suite-ours, suite-nvidia, compare
#                       torch-suite.py (with --symm) under ours and under NVIDIA's library; the
#                       DDP loss curves must agree, step times are printed
#   c nonblocking       torch-suite.py under ours with TORCH_NCCL_USE_COMM_NONBLOCKING=1
#   d replaced-file     ours copied over NVIDIA's libnccl.so.2 in the nvidia.nccl package (restored
#                       by a trap on every exit path), no LD_PRELOAD: bindings + a short suite run;
#                       the original must be back byte for byte (cmp)
#   e fault-abort, fault-watchdog
#                       scripts/torch-faults.py under ours (and under NVIDIA's as "reference")
set -u -o pipefail

OURS=""
GPUS=""
OUT=./out-torch
STEPS=200
REFERENCE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --ours) OURS="${2:-}"; shift ;;
    --gpus) GPUS="${2:-}"; shift ;;
    --out) OUT="${2:-}"; shift ;;
    --steps) STEPS="${2:-}"; shift ;;
    --no-reference) REFERENCE=0 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "torch-all: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$OURS" ] || { echo "torch-all: --ours PATH/libnccl.so.2 is required" >&2; exit 2; }
[ -f "$OURS" ] || { echo "torch-all: --ours $OURS: no such file" >&2; exit 2; }
OURS=$(readlink -f "$OURS")

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset LD_PRELOAD
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
rm -f "$OUT/ours.json" "$OUT/nvidia.json"
WORK=$(mktemp -d /tmp/torch-all.XXXXXX)
START=$SECONDS
PASSED=0
FAILED=0
FAILS=()

say() { echo "$*" | tee -a "$LOG"; }
pass() { PASSED=$((PASSED + 1)); say "PASS $1${2:+ ($2)}"; echo "PASS $1${2:+ ($2)}" >>"$SUMMARY"; }
fail() { FAILED=$((FAILED + 1)); FAILS+=("$1"); say "FAIL $1: $2"; echo "FAIL $1: $2" >>"$SUMMARY"; }
reference() { say "reference $1: $2 (not counted)"; echo "reference $1: $2 (not counted)" >>"$SUMMARY"; }

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
  local t0=$SECONDS
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
if [ -z "$GPUS" ]; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  [ "${GPUS:-0}" -gt 0 ] || GPUS=$(timeout 120 "$PY" -c 'import torch; print(torch.cuda.device_count())' 2>>"$LOG")
fi
NVDIR=$(timeout 60 "$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>>"$LOG")
NVLIB=$NVDIR/libnccl.so.2
BACKUP=$NVLIB.torch-all-backup
TORCHV=$(timeout 120 "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())' 2>>"$LOG")
say "torch-all: ours=$OURS gpus=$GPUS steps=$STEPS out=$OUT"
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
if [ "${GPUS:-0}" -lt 2 ]; then
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
mkdir -p "$WORK/ld-a"
run bindings-run 150 env LD_PRELOAD="$OURS" LD_DEBUG=bindings LD_DEBUG_OUTPUT="$WORK/ld-a/ld" \
  "${TORCHRUN[@]}" --nproc-per-node 2 "$SUITE" --steps 5
if suite_ok bindings-run; then
  bindings_item bindings "$OURS" "$WORK/ld-a"
else
  fail bindings "the traced run failed: $(why bindings-run)"
  rm -rf "$WORK/ld-a"
fi

# ---- b. suite under ours and under NVIDIA's, then the comparison
run suite-ours 200 env LD_PRELOAD="$OURS" "${TORCHRUN[@]}" --nproc-per-node "$GPUS" "$SUITE" \
  --steps "$STEPS" --symm --out "$OUT/ours.json"
grep -E '^(PASS|FAIL|    SYMM|DDP step|[0-9]+ passed)' "$WORK/suite-ours.out"
if suite_ok suite-ours; then pass suite-ours "$(grep -E '^[0-9]+ passed' "$WORK/suite-ours.out")"; else fail suite-ours "$(why suite-ours)"; fi

run suite-nvidia 200 "${TORCHRUN[@]}" --nproc-per-node "$GPUS" "$SUITE" \
  --steps "$STEPS" --symm --out "$OUT/nvidia.json"
grep -E '^(FAIL|    SYMM|DDP step|[0-9]+ passed)' "$WORK/suite-nvidia.out"
if suite_ok suite-nvidia; then pass suite-nvidia "$(grep -E '^[0-9]+ passed' "$WORK/suite-nvidia.out")"; else fail suite-nvidia "$(why suite-nvidia)"; fi

if [ -f "$OUT/ours.json" ] && [ -f "$OUT/nvidia.json" ]; then
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

# ---- c. non-blocking communicators
run nonblocking 180 env LD_PRELOAD="$OURS" TORCH_NCCL_USE_COMM_NONBLOCKING=1 TORCH_CPP_LOG_LEVEL=INFO \
  "${TORCHRUN[@]}" --nproc-per-node "$GPUS" "$SUITE" --steps 50 --nonblocking
grep -E '^(FAIL|TORCH_NCCL_USE|PASS communicators|[0-9]+ passed)' "$WORK/nonblocking.out"
if suite_ok nonblocking; then pass nonblocking "$(grep -E '^[0-9]+ passed' "$WORK/nonblocking.out")"; else fail nonblocking "$(why nonblocking)"; fi

# ---- d. ours in place of NVIDIA's file, no LD_PRELOAD
d_ok=1
d_why=""
if cp -p "$NVLIB" "$BACKUP" && cmp -s "$NVLIB" "$BACKUP"; then
  REPLACED=1
  if cp "$OURS" "$NVLIB.torch-all-tmp" && chmod --reference="$BACKUP" "$NVLIB.torch-all-tmp" &&
    mv -f "$NVLIB.torch-all-tmp" "$NVLIB" && cmp -s "$OURS" "$NVLIB"; then
    say "replaced $NVLIB with ours (original in $BACKUP)"
    mkdir -p "$WORK/ld-d"
    run replaced-run 180 env -u LD_PRELOAD LD_DEBUG=bindings LD_DEBUG_OUTPUT="$WORK/ld-d/ld" \
      "${TORCHRUN[@]}" --nproc-per-node "$GPUS" "$SUITE" --steps 20
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
if [ "$d_ok" = 1 ]; then pass replaced-file "suite, bindings, original restored (cmp)"; else fail replaced-file "${d_why#; }"; fi

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
fault() { # LABEL(ours|nvidia) SCENARIO
  local lib=$1 scen=$2 name="fault-$2"
  local pre=()
  [ "$lib" = ours ] && pre=(env LD_PRELOAD="$OURS")
  [ "$lib" = nvidia ] && name="$name-nvidia"
  run "$name" 120 ${pre[@]+"${pre[@]}"} "${TORCHRUN[@]}" --nproc-per-node 2 "$FAULTS" "$scen"
  grep -E '^FAULT-' "$WORK/$name.out"
  local verdict
  if [ "$scen" = abort ]; then verdict=$(judge_abort "$name"); else verdict=$(judge_watchdog "$name"); fi
  if [ "$lib" = nvidia ]; then
    reference "$name" "$verdict"
  elif [ "${verdict%% *}" = ok ]; then
    pass "$name" "${verdict#ok }"
  else
    fail "$name" "$verdict"
  fi
}
fault ours abort
fault ours watchdog
if [ "$REFERENCE" = 1 ]; then
  fault nvidia abort
  fault nvidia watchdog
fi

say ""
say "torch-all: $PASSED passed, $FAILED failed in $((SECONDS - START)) s${FAILS[*]:+ (failed: ${FAILS[*]})}"
echo "torch-all: $PASSED passed, $FAILED failed in $((SECONDS - START)) s" >>"$SUMMARY"
[ "$FAILED" = 0 ]
