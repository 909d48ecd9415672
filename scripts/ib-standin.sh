#!/usr/bin/env bash
# ib-standin.sh: NVIDIA's own NCCL IB transport (NCCL_NET=IB, host memory) over the software
# verbs device (ffi-tests/ibverbs/soft_verbs.c, a stand-in libibverbs.so.1), next to oxccl's,
# on GPU 0 of the GPU machine: ranks in processes of their own, each claiming its own host
# (oxccl-bench --hostid-per-rank: NCCL_HOSTID), so every byte goes through the network.
# Run from the repository root (no Rust needed): scripts/ib-standin.sh
#
# Steps (each with a time limit, all within IB_STANDIN_BUDGET; in order of importance):
#   1. the stand-in: built with gcc when <infiniband/verbs.h> is there, else the prebuilt
#      .device/lib/soft-verbs/libibverbs.so.1 (scripts/stage-device); put first on
#      LD_LIBRARY_PATH as libibverbs.so and libibverbs.so.1 (NCCL dlopens both names)
#   2. /sys/class/infiniband/soft_0/device in a mount namespace (scripts/ib-sysfs-ns.sh),
#      when unshare is permitted; otherwise NVIDIA's NCCL warns "Could not find real path of
#      soft_0" and places the NIC on the CPU, which works too (said in the summary)
#   3. proof that NVIDIA's NCCL used IB: NCCL_DEBUG=INFO, its "NET/IB : Using" and
#      "via NET/IB" lines
#   4. exact values, every collective, 2 processes (sizes up to 64 MiB): NVIDIA's with
#      NCCL_NET=IB, then oxccl's (which reports "oxccl has no IB network" when NCCL_NET=IB is
#      refused with its "no such network" error)
#   5. side by side (oxccl-bench --vs): IB (oxccl vs NVIDIA, or NVIDIA alone), then Socket
#   6. exact values with 4 processes (4 hosts), NVIDIA's then oxccl's; then side by side over
#      IB with 4 processes (oxccl-bench --vs, up to 16 MiB)
#   7. CUDA graphs over IB (oxccl-bench --graph, 2 processes, then 4): NVIDIA's then oxccl's
#   8. NVIDIA 2.32.3 (NVLIB2, default the unpacked .device/ref copy) over the stand-in: its
#      IB proof, exact values with 2 processes, and side by side with oxccl (2, then 4
#      processes)
# Environment:
#   NVLIB=/path/libnccl.so.2   NVIDIA's library (default: PyTorch's, python3 -c 'import nvidia.nccl')
#   OURS=/path/libnccl.so.2    ours (default .device/lib/libnccl.so.2); BENCH (default .device/bin/oxccl-bench)
#   OUT=dir                    where the summary and one tar.gz of every log go (default /tmp/ib-standin)
#   IB_STANDIN_SYSFS=0         skip step 2; IB_STANDIN_PCI=/sys/devices/... the PCI function for it
#   IB_STANDIN_QUICK=1         fewer types and sizes (a smoke run)
#   IB_STANDIN_PREBUILT=1      use .device/lib/soft-verbs/libibverbs.so.1 even where gcc could build
#                              it (the binary whose offsets the crash traces name)
#   IB_STANDIN_BUDGET=540      seconds for the whole run: a step gets what is left (minus 20 s),
#                              a step with under 30 s left is skipped (said in the summary)
# Every run: NCCL_SOCKET_IFNAME=lo (bootstrap and the IB transport's out-of-band socket),
# NCCL_NET_GDR_LEVEL=LOC (host memory: the stand-in cannot reach GPU memory).
# Exit status: 0 NVIDIA's IB runs exact and IB was used; 1 wrong results; 3 something could not
# run (the summary says what).
set -uo pipefail

ROOT=$(pwd)
STATUS=0
if [ "${IB_STANDIN_INNER:-0}" != 1 ]; then # the inner run (step 2) keeps the outer one's logs
  OUT=${OUT:-/tmp/ib-standin}
  mkdir -p "$OUT" || exit 3
  OUT=$(cd "$OUT" && pwd)
  WORK=$(mktemp -d /tmp/ib-standin.XXXXXX) || exit 3
  LOGS=$WORK/ib-standin
  mkdir -p "$LOGS"
  SUMMARY=$LOGS/summary.txt
  : >"$SUMMARY"
  START=$(date +%s)
fi

say() { printf '[%4d s] %s\n' $(($(date +%s) - START)) "$*" | tee -a "$SUMMARY"; }
worst() { [ "$1" -gt "$STATUS" ] && STATUS=$1; return 0; }
finish() {
  say "logs: $OUT/ib-standin.tar.gz (summary also in $OUT/ib-standin-summary.txt)"
  cp "$SUMMARY" "$OUT/ib-standin-summary.txt"
  tar czf "$OUT/ib-standin.tar.gz" -C "$WORK" ib-standin
  rm -rf "$WORK"
  exit "$STATUS"
}

# ---- steps 1 and 2 run outside; inside the namespace of step 2 only steps 3-5
if [ "${IB_STANDIN_INNER:-0}" != 1 ]; then
  DEV=$ROOT/.device
  OURS=${OURS:-$DEV/lib/libnccl.so.2}
  BENCH=${BENCH:-$DEV/bin/oxccl-bench}
  if [ -z "${NVLIB:-}" ]; then
    nvdir=$(timeout 60 python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$nvdir" ] && [ -f "$nvdir/libnccl.so.2" ] && NVLIB=$nvdir/libnccl.so.2
  fi
  NVLIB=${NVLIB:-}
  if [ -z "${NVLIB2:-}" ] && [ -f "$DEV/ref/libnccl-2.32.3.so.2.xz" ]; then
    mkdir -p "$DEV/ref/lib"
    [ -f "$DEV/ref/lib/libnccl.so.2" ] || { xz -dc "$DEV/ref/libnccl-2.32.3.so.2.xz" >"$DEV/ref/lib/libnccl.so.2.part" &&
      mv "$DEV/ref/lib/libnccl.so.2.part" "$DEV/ref/lib/libnccl.so.2"; }
    [ -f "$DEV/ref/lib/libnccl.so.2" ] && NVLIB2=$DEV/ref/lib/libnccl.so.2
  fi
  NVLIB2=${NVLIB2:-}
  say "ib-standin: ours $OURS; NVIDIA ${NVLIB:-not found}; NVIDIA 2.32.3 ${NVLIB2:-not found}; bench $BENCH; logs $LOGS"
  {
    date -u
    timeout 30 nvidia-smi -L
    ldd --version | head -1
    uname -a
    for f in /sys/kernel/mm/memory_peers/nv_mem/version /sys/kernel/mm/memory_peers/nv_mem_nc/version \
      /sys/module/nvidia_peermem/version; do
      [ -e "$f" ] && echo "peer memory driver present: $f (NCCL would offer GPU Direct RDMA; NCCL_NET_GDR_LEVEL=LOC keeps host memory)"
    done
    ls -d /sys/class/infiniband/* 2>/dev/null | sed 's/^/real HCA in sysfs: /'
  } >"$LOGS/machine.txt" 2>&1
  [ -x "$BENCH" ] || { say "FAIL: $BENCH missing (scripts/stage-device, carry .device)"; STATUS=3; finish; }
  [ -f "$OURS" ] || { say "FAIL: $OURS missing (scripts/stage-device)"; STATUS=3; finish; }
  [ -n "$NVLIB" ] || say "NVIDIA's NCCL not found (set NVLIB=/path/libnccl.so.2): its rows are skipped"

  # ---- 1. the stand-in
  SV=$LOGS/soft-verbs
  mkdir -p "$SV"
  if [ "${IB_STANDIN_PREBUILT:-0}" != 1 ] && [ -f ffi-tests/ibverbs/soft_verbs.c ] && gcc -shared -fPIC -O2 -Wall -fvisibility=hidden \
      -Wl,-soname,libibverbs.so.1 -Wl,--version-script=ffi-tests/ibverbs/libibverbs.map \
      -o "$SV/libibverbs.so.1" ffi-tests/ibverbs/soft_verbs.c -lpthread >"$LOGS/soft-verbs-build.log" 2>&1; then
    say "stand-in: built here from ffi-tests/ibverbs/soft_verbs.c"
  elif [ -f "$DEV/lib/soft-verbs/libibverbs.so.1" ]; then
    cp "$DEV/lib/soft-verbs/libibverbs.so.1" "$SV/" || exit 3
    say "stand-in: prebuilt $DEV/lib/soft-verbs/libibverbs.so.1 (no rdma-core headers here: $(tail -n 1 "$LOGS/soft-verbs-build.log" | cut -c1-100))"
  else
    say "FAIL: no stand-in: gcc could not build it ($LOGS/soft-verbs-build.log) and $DEV/lib/soft-verbs/libibverbs.so.1 is missing (scripts/stage-device)"
    STATUS=3
    finish
  fi
  ln -sf libibverbs.so.1 "$SV/libibverbs.so"
  export LD_LIBRARY_PATH="$SV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # A crash of a rank names where it happened (SEGV_TRACE lines in its log): ffi-tests/ibverbs/
  # segv_trace.c, built by scripts/stage-device, preloaded into every run.
  if [ -f "$DEV/lib/soft-verbs/segv_trace.so" ]; then
    export LD_PRELOAD="$DEV/lib/soft-verbs/segv_trace.so${LD_PRELOAD:+:$LD_PRELOAD}"
    say "crash traces: LD_PRELOAD=$DEV/lib/soft-verbs/segv_trace.so"
  fi
  export OURS BENCH NVLIB NVLIB2 LOGS SUMMARY START

  # ---- 2. the sysfs entry, in a mount namespace when permitted
  if [ "${IB_STANDIN_SYSFS:-1}" != 0 ] && [ -x scripts/ib-sysfs-ns.sh ]; then
    pci=(--pci "${IB_STANDIN_PCI:-auto}")
    if probe=$(scripts/ib-sysfs-ns.sh "${pci[@]}" -- true 2>&1); then
      say "sysfs: ${probe#ib-sysfs-ns: }"
      IB_STANDIN_INNER=1 scripts/ib-sysfs-ns.sh "${pci[@]}" -- "$0" "$@" 2>>"$LOGS/sysfs-ns.log"
      STATUS=$?
      [ "$STATUS" -gt 3 ] && { say "the run in the namespace ended with status $STATUS ($LOGS/sysfs-ns.log)"; STATUS=3; }
      finish
    fi
    say "sysfs: no /sys/class/infiniband/soft_0 (${probe#ib-sysfs-ns: }); NVIDIA's NCCL will warn 'Could not find real path of soft_0' and place the NIC on the CPU"
  else
    say "sysfs: not made (IB_STANDIN_SYSFS=0); the NIC has no PCI path"
  fi
fi

# NCCL_GIN_TYPE=0: NVIDIA's 2.28.9 probes its GPU-initiated (GDAKI) IB path when IB devices
# exist; when that probe initializes but finds no device (the stand-in has no mlx5 interface)
# it calls through the placeholder pointer (ncclGin_t *)-1 and crashes in ncclNetInit
# (src/plugin/net.cc). GIN is the device API's transport, which no collective uses: off.
export NCCL_SOCKET_IFNAME=lo NCCL_NET_GDR_LEVEL=LOC NCCL_GIN_TYPE=0
QUICK=${IB_STANDIN_QUICK:-0}
if [ "$QUICK" = 1 ]; then
  TYPES=float,int8
  OPS=sum,max
  SIZES2=0,12,65540,1048580
  SIZES4=0,12,65540
else
  TYPES=float,int8,bfloat16,double
  OPS=sum,max,premulsum
  SIZES2=0,12,1028,65540,1048580,16777220,67108864
  SIZES4=0,12,65540,1048580
fi
HOSTS2=(-p 2 --ranks-per-gpu 2 --hostid-per-rank)
HOSTS4=(-p 4 --ranks-per-gpu 4 --hostid-per-rank)

DEADLINE=$((START + ${IB_STANDIN_BUDGET:-540}))
# bench_table LOG: a side-by-side run's per-band summary (a single run's last 40 table lines
# when it has none), for the summary
bench_table() {
  [ -f "$1" ] || return 0
  echo "---- ${1##*/}" >>"$SUMMARY"
  if grep -q '^# Side-by-side summary' "$1"; then
    sed -n '/^# Side-by-side summary/,$p' "$1" | grep -E '^#|^ +[a-z_]+ ' >>"$SUMMARY"
  else
    grep -E '^#|^ *[0-9]' "$1" | grep -v -E '^# (Using|nThread|Rank)' | tail -n 40 >>"$SUMMARY"
  fi
}
# step NAME LIMIT ENV... -- BENCH-ARGS...: runs the benchmark, sets RC and LOG (RC 125: skipped
# for want of time).
step() {
  local name=$1 lim=$2
  shift 2
  local left=$((DEADLINE - $(date +%s) - 20))
  if [ "$left" -lt 30 ]; then
    say "$name: SKIPPED (the budget IB_STANDIN_BUDGET is spent)"
    RC=125
    LOG=/dev/null
    return 0
  fi
  [ "$lim" -gt "$left" ] && lim=$left
  local pre=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do pre+=("$1"); shift; done
  shift
  LOG=$LOGS/$name.log
  local t0=$SECONDS
  timeout -k 10 "$lim" env ${pre[@]+"${pre[@]}"} "$BENCH" "$@" >"$LOG" 2>&1
  RC=$?
  local wrong
  wrong=$(grep -c 'oxccl-bench: WRONG' "$LOG")
  local verdict
  case $RC in
    0) verdict=ok ;; 1) verdict=WRONG ;; 3) verdict=ERROR ;; 4) verdict=HANG ;;
    124 | 137) verdict="KILLED at ${lim} s" ;; *) verdict="FAIL($RC)" ;;
  esac
  say "$name: $verdict ($((SECONDS - t0)) s, $wrong WRONG lines)"
  if [ "$RC" != 0 ]; then
    grep -E 'oxccl-bench: |NCCL WARN|error' "$LOG" | grep -v '^#' | tail -3 | cut -c1-200 | sed 's/^/      /' | tee -a "$SUMMARY"
    grep -m 14 'SEGV_TRACE' "$LOG" | cut -c1-200 | sed 's/^/      /' | tee -a "$SUMMARY"
  fi
}

# NVIDIA's last run used IB: its INFO lines.
ib_proof() {
  local using via
  using=$(grep -m1 'NET/IB : Using' "$1")
  via=$(grep -c 'via NET/IB' "$1")
  if [ -n "$using" ] && [ "$via" -gt 0 ]; then
    say "NVIDIA used IB: ${using#*NCCL INFO }; $via connection lines 'via NET/IB', e.g.: $(grep -m1 'via NET/IB' "$1" | sed 's/.*NCCL INFO //')"
    return 0
  fi
  say "NVIDIA did NOT show IB use (NET/IB : Using: ${using:-absent}; 'via NET/IB' lines: $via); see $1"
  grep -E 'NET/IB|NET/Plugin|Using network|NCCL WARN' "$1" | head -8 | cut -c1-200 | sed 's/^/      /' | tee -a "$SUMMARY"
  return 1
}

common=(-c all -d "$TYPES" -o "$OPS" --inplace both --check 1 -w 0 -n 1 --timeout 60)
IB=(NCCL_NET=IB)

# ---- 3. NVIDIA's NCCL over the stand-in, with its INFO log
if [ -n "$NVLIB" ]; then
  step nvidia-ib-proof 90 "${IB[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH -- --lib "$NVLIB" \
    -c all_reduce,sendrecv -d float -o sum --inplace 0 --check 1 -w 0 -n 1 --timeout 60 --sizes 1048576 "${HOSTS2[@]}"
  ib_proof "$LOG" || worst 3
  [ "$RC" = 0 ] || worst 3
  grep -m3 -E 'Could not find real path|pciPath=|NET/IB: \[' "$LOG" | sed 's/.*NCCL /      NCCL /' | cut -c1-200 | tee -a "$SUMMARY"

  # ---- 4. exact values: NVIDIA's
  step nvidia-ib-2proc 180 "${IB[@]}" -- --lib "$NVLIB" "${common[@]}" --sizes "$SIZES2" "${HOSTS2[@]}"
  case $RC in 0) ;; 1) worst 1 ;; *) worst 3 ;; esac
fi

# oxccl's IB network in use: its INFO lines (the NIC, and the GPU-NIC choice).
step ours-ib-proof 60 "${IB[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET -- --lib "$OURS" \
  -c all_reduce -d float -o sum --inplace 0 --check 1 -w 0 -n 1 --timeout 60 --sizes 1048576 "${HOSTS2[@]}"
if grep -q 'NET/IB : Using' "$LOG"; then
  say "oxccl used IB: $(grep -m1 'NET/IB : Using' "$LOG" | sed 's/.*NCCL INFO //' | cut -c1-160)"
  grep -m2 -E 'uses \[|Using network' "$LOG" | sed 's/.*NCCL INFO /      /' | cut -c1-200 | tee -a "$SUMMARY"
else
  say "oxccl did NOT show 'NET/IB : Using' (see $LOG)"
fi

# ---- 4. exact values: ours (reported, not counted: oxccl's IB network may not exist yet)
OURS_IB=0
step ours-ib-2proc 180 "${IB[@]}" NCCL_DEBUG=WARN -- --lib "$OURS" "${common[@]}" --sizes "$SIZES2" "${HOSTS2[@]}"
if [ "$RC" = 0 ] || [ "$RC" = 1 ]; then
  OURS_IB=1
elif grep -q 'IB: no such network' "$LOG"; then
  say "oxccl has no IB network: $(grep -m1 -o 'NCCL_NET / netName IB: no such network[^"]*' "$LOG" | cut -c1-160)"
else
  say "oxccl's NCCL_NET=IB run failed (not for want of an IB network); see $LOG"
fi

# ---- 5. side by side: IB, then Socket
perf=(-c all_reduce,all_gather,sendrecv -d float -o sum -b 8 -e 64M -f 4 --inplace 0 --check 1 -w 3 -n 10
  --timeout 60 "${HOSTS2[@]}")
if [ -n "$NVLIB" ]; then
  if [ "$OURS_IB" = 1 ]; then
    step vs-ib 120 "${IB[@]}" -- --lib "$OURS" --vs "$NVLIB" "${perf[@]}"
  else
    step nvidia-ib-perf 90 "${IB[@]}" -- --lib "$NVLIB" "${perf[@]}"
  fi
  [ "$RC" = 1 ] && worst 1
  step vs-socket 120 NCCL_NET=Socket -- --lib "$OURS" --vs "$NVLIB" "${perf[@]}"
  [ "$RC" = 1 ] && worst 1
  # the bandwidth tables, for the summary
  for f in "$LOGS"/nvidia-ib-perf.log "$LOGS"/vs-ib.log "$LOGS"/vs-socket.log; do bench_table "$f"; done
else
  step ours-socket-perf 90 NCCL_NET=Socket -- --lib "$OURS" "${perf[@]}"
fi

# ---- 6. four processes, four hosts
if [ -n "$NVLIB" ]; then
  step nvidia-ib-4proc 100 "${IB[@]}" -- --lib "$NVLIB" "${common[@]}" --sizes "$SIZES4" "${HOSTS4[@]}"
  case $RC in 0 | 125) ;; 1) worst 1 ;; *) worst 3 ;; esac
fi
[ "$OURS_IB" = 1 ] &&
  step ours-ib-4proc 100 "${IB[@]}" -- --lib "$OURS" "${common[@]}" --sizes "$SIZES4" "${HOSTS4[@]}"
perf4=(-c all_reduce,all_gather,sendrecv -d float -o sum -b 8 -e 16M -f 4 --inplace 0 --check 1 -w 3 -n 10
  --timeout 60 "${HOSTS4[@]}")
if [ -n "$NVLIB" ] && [ "$OURS_IB" = 1 ]; then
  step vs-ib-4proc 150 "${IB[@]}" -- --lib "$OURS" --vs "$NVLIB" "${perf4[@]}"
  [ "$RC" = 1 ] && worst 1
  bench_table "$LOGS/vs-ib-4proc.log"
fi

# ---- 7. CUDA graphs over IB
graph=(-c all -d float -o sum,max --inplace both --check 1 -w 0 -n 2 --graph --timeout 60 --sizes 0,12,65540,1048580)
if [ -n "$NVLIB" ]; then
  step nvidia-ib-graph 90 "${IB[@]}" -- --lib "$NVLIB" "${graph[@]}" "${HOSTS2[@]}"
  case $RC in 0 | 125) ;; 1) worst 1 ;; *) worst 3 ;; esac
fi
[ "$OURS_IB" = 1 ] && step ours-ib-graph 90 "${IB[@]}" -- --lib "$OURS" "${graph[@]}" "${HOSTS2[@]}"
if [ -n "$NVLIB" ]; then
  step nvidia-ib-graph-4proc 90 "${IB[@]}" -- --lib "$NVLIB" "${graph[@]}" "${HOSTS4[@]}"
  case $RC in 0 | 125) ;; 1) worst 1 ;; *) worst 3 ;; esac
fi
[ "$OURS_IB" = 1 ] && step ours-ib-graph-4proc 90 "${IB[@]}" -- --lib "$OURS" "${graph[@]}" "${HOSTS4[@]}"

# ---- 8. NVIDIA 2.32.3 over the stand-in
if [ -n "$NVLIB2" ]; then
  step nvidia232-ib-proof 90 "${IB[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET -- --lib "$NVLIB2" \
    -c all_reduce,sendrecv -d float -o sum --inplace 0 --check 1 -w 0 -n 1 --timeout 60 --sizes 1048576 "${HOSTS2[@]}"
  ib_proof "$LOG" || say "(NVIDIA 2.32.3)"
  step nvidia232-ib-2proc 120 "${IB[@]}" -- --lib "$NVLIB2" "${common[@]}" --sizes "$SIZES2" "${HOSTS2[@]}"
  [ "$OURS_IB" = 1 ] && step vs232-ib 120 "${IB[@]}" -- --lib "$OURS" --vs "$NVLIB2" "${perf[@]}"
  bench_table "$LOGS/vs232-ib.log"
  [ "$OURS_IB" = 1 ] && step vs232-ib-4proc 150 "${IB[@]}" -- --lib "$OURS" --vs "$NVLIB2" "${perf4[@]}"
  bench_table "$LOGS/vs232-ib-4proc.log"
fi

say "done: status $STATUS (0 NVIDIA's IB exact and used; 1 wrong results; 3 something did not run)"
if [ "${IB_STANDIN_INNER:-0}" = 1 ]; then exit "$STATUS"; fi
finish
