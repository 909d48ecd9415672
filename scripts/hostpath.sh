#!/usr/bin/env bash
# The per-call cost of small collectives, oxccl beside NVIDIA's libraries, on GPU 0: runs
# ffi-tests/gpu/hostpath.c (built by scripts/stage-device into .device/bin) against ours
# (.device/lib), NVIDIA's 2.28.9 (PyTorch's, found through python3's nvidia.nccl) and NVIDIA's
# 2.32.3 (.device/ref, made by ../shared/tools/nccl-reference 2.32.3 90 .device/ref). Writes
# ${OUT:-/tmp/hostpath}/hostpath.tar.gz: <lib>-<mode>-<run>.txt (ROW lines: host µs per call,
# stream µs per operation, the process's CPU µs per call), side-by-side.txt (also left beside
# the archive), profile.txt (oxccl's host profile of each mode), runs.txt and floor.txt (what the CUDA driver alone
# charges per copy, kernel launch and event record: ffi-tests/gpu/enqueue_floor.c). Modes: 1 = one rank, 2 = two ranks of one
# process (group calls), p = two processes (under MPS when nvidia-cuda-mps-control starts a
# daemon; it is stopped at the end).
# usage: scripts/hostpath.sh [ITERATIONS]   (calls per case, default 2000; HOSTPATH_SIZES,
#        HOSTPATH_MODES (default "1 2 p") and HOSTPATH_BEFORE=<folder of another oxccl build>)
# The same library differs by 1-2 µs per call from one process to the next (which CPU the
# calling thread runs on; CPU 0 is the slow one), so every library runs HOSTPATH_REPEAT times
# (default 3), the libraries taking turns, each run pinned to the same CPUs near GPU 0
# (HOSTPATH_CPUS, default two CPUs of the GPU's NUMA node other than CPU 0, scripts/gpu-cpus;
# "none" leaves the scheduler free); side-by-side.txt gives each row's median over the runs,
# and <lib>-<mode>-<run>.txt keep every run.
set -u
cd "$(dirname "$0")/.."
# Everything is written in a folder of its own; what stays in OUT is side-by-side.txt and
# hostpath.tar.gz (every file of the run), so a device call that returns few files loses none.
DEST=${OUT:-/tmp/hostpath}
mkdir -p "$DEST" || exit 2
OUT=$(mktemp -d /tmp/hostpath-run.XXXXXX) || exit 2
N=${1:-2000}
export NCCL_NVLS_ENABLE=0 NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_DEBUG=WARN
libs=("ours=.device/lib")
nvdir=$(timeout 60 python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[[ -n $nvdir && -f $nvdir/libnccl.so.2 ]] && libs+=("nv2289=$nvdir")
if [[ -f .device/ref/libnccl-2.32.3.so.2.xz ]]; then
  mkdir -p .device/ref/lib
  [[ -f .device/ref/lib/libnccl.so.2 ]] || xz -dc .device/ref/libnccl-2.32.3.so.2.xz >.device/ref/lib/libnccl.so.2
  libs+=("nv2323=.device/ref/lib")
fi
# Another oxccl to compare with (HOSTPATH_BEFORE=folder of its libnccl.so.2), e.g. the build
# before a change, and oxccl's own host profile of each run (OXCCL_HOST_PROFILE=1, in .err).
[[ -n ${HOSTPATH_BEFORE:-} && -f $HOSTPATH_BEFORE/libnccl.so.2 ]] && libs+=("before=$HOSTPATH_BEFORE")
# The profile's clock reads cost the profiled run about 0.1 us per stage: ours is timed without
# it, and run once more with it (oursprof) for the breakdown.
libs+=("oursprof=.device/lib")
MODES=${HOSTPATH_MODES:-1 2 p}
REPEAT=${HOSTPATH_REPEAT:-3}
# CPUs near GPU 0 (scripts/gpu-cpus), unless HOSTPATH_CPUS says.
cpus=${HOSTPATH_CPUS:-$(scripts/gpu-cpus 2)}
pin=()
[[ -n $cpus && $cpus != none ]] && command -v taskset >/dev/null && pin=(taskset -c "$cpus")
echo "runs pinned to CPUs: ${cpus:-none} (${pin[*]:-not pinned}); $REPEAT runs per library, in turns" | tee "$OUT/runs.txt"
SIZES=${HOSTPATH_SIZES:-8,32768,524288,8388608,16777216,33554432}
# MPS lets the kernels of the two processes of -p run side by side (stopped again at the end;
# its pipe folder is HOSTPATH_MPS_DIR, default /tmp/hostpath-mps, so that a caller that had to
# kill this script can still stop it: CUDA_MPS_PIPE_DIRECTORY=... nvidia-cuda-mps-control <<<quit).
mps_dir=${HOSTPATH_MPS_DIR:-/tmp/hostpath-mps}
mkdir -p "$mps_dir"
export CUDA_MPS_PIPE_DIRECTORY=$mps_dir CUDA_MPS_LOG_DIRECTORY=$mps_dir
mps=0
stop_mps() { [[ $mps == 1 ]] && echo quit | nvidia-cuda-mps-control && mps=0; }
trap stop_mps EXIT
for mode in $MODES; do
  args=(-r "$mode")
  if [[ $mode == p ]]; then
    args=(-p)
    if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then
      mps=1
      echo "MPS daemon started for the 2-process runs" | tee -a "$OUT/runs.txt"
    else
      echo "no MPS daemon: the 2-process runs time-slice the GPU" | tee -a "$OUT/runs.txt"
    fi
  fi
  for ((run = 1; run <= REPEAT; run++)); do
    for entry in "${libs[@]}"; do
      name=${entry%%=*} dir=${entry#*=}
      prof=()
      [[ $name == oursprof ]] && prof=(OXCCL_HOST_PROFILE=1)
      # The profile is one breakdown, not a timing: one run of it is enough.
      [[ $name == oursprof && $run -gt 1 ]] && continue
      env "${prof[@]}" LD_LIBRARY_PATH="$dir" timeout -k 5 150 "${pin[@]}" .device/bin/hostpath "${args[@]}" \
        -n "$N" -s "$SIZES" >"$OUT/$name-$mode-$run.txt" 2>"$OUT/$name-$mode-$run.err"
      echo "rc=$? $name mode=$mode run=$run: $(grep -c '^ROW' "$OUT/$name-$mode-$run.txt") rows" | tee -a "$OUT/runs.txt"
    done
  done
done
stop_mps
# The driver's own price per stream operation (ffi-tests/gpu/enqueue_floor.c): the floor under
# every library's rows.
if [[ -x .device/bin/enqueue_floor ]]; then
  kflag=()
  if [[ -f .device/lib/oxccl_kernels.fatbin.xz ]] && xz -dc .device/lib/oxccl_kernels.fatbin.xz >"$OUT/kernels.fatbin"; then
    kflag=(-k "$OUT/kernels.fatbin")
  fi
  timeout -k 5 60 "${pin[@]}" .device/bin/enqueue_floor -n "$N" "${kflag[@]}" >"$OUT/floor.txt" 2>&1
  echo "rc=$? enqueue_floor: $(grep -c '^FLOOR' "$OUT/floor.txt") rows" | tee -a "$OUT/runs.txt"
  rm -f "$OUT/kernels.fatbin"
fi
# Side by side: one line per case, host, stream and CPU µs of each library.
python3 - "$OUT" "${libs[@]}" >"$OUT/side-by-side.txt" <<'PY'
import sys, re, os
out, libs = sys.argv[1], [l.split('=')[0] for l in sys.argv[2:]]
import glob
samples = {}
for mode in ("1", "2", "p"):
    for lib in libs:
        for path in sorted(glob.glob(os.path.join(out, f"{lib}-{mode}-*.txt"))):
            for line in open(path):
                m = re.match(r"ROW (\d+) (\S+)\s+(\d+) (\S+)\s+host=([\d.]+) stream=([\d.]+)(?: cpu=([\d.]+))?", line)
                if m:
                    key = (mode, m[2], int(m[3]), m[4])
                    cpu = float(m[7]) if m[7] is not None else float("nan")
                    samples.setdefault(key, {}).setdefault(lib, []).append((float(m[5]), float(m[6]), cpu))
# Each library's row: the run with the median stream time (host and CPU time from that run).
rows = {k: {lib: sorted(v, key=lambda t: t[1])[(len(v) - 1) // 2] for lib, v in libs_.items()}
        for k, libs_ in samples.items()}
def ratio(r, i):
    nv = [r[l][i] for l in libs if l.startswith("nv") and l in r and r[l][i] == r[l][i]]
    ok = "ours" in r and r["ours"][i] == r["ours"][i] and nv and min(nv) > 0
    return "%.2f" % (r["ours"][i] / min(nv)) if ok else "-"
print("mode collective bytes place | " + " | ".join(f"{l} host/stream/cpu" for l in libs)
      + " | ours / best NVIDIA: stream | host | cpu (medians of the runs)")
for key in sorted(rows):
    r = rows[key]
    cells = " | ".join("%.2f / %.2f / %.2f" % r[l] if l in r else "-" for l in libs)
    print(f"{key[0]} {key[1]} {key[2]} {key[3]} | {cells} | {ratio(r, 1)} | {ratio(r, 0)} | {ratio(r, 2)}")
PY
cat "$OUT/side-by-side.txt"
grep -H "host profile" "$OUT"/oursprof-*.err >"$OUT/profile.txt" 2>/dev/null
cat "$OUT/profile.txt"
cp "$OUT/side-by-side.txt" "$DEST/" && tar -czf "$DEST/hostpath.tar.gz" -C "$OUT" . && rm -rf "$OUT"
