#!/usr/bin/env bash
# The per-call cost of small collectives, oxccl beside NVIDIA's libraries, on GPU 0: runs
# ffi-tests/gpu/hostpath.c (built by scripts/stage-device into .device/bin) against ours
# (.device/lib), NVIDIA's 2.28.9 (PyTorch's, found through python3's nvidia.nccl) and NVIDIA's
# 2.32.3 (.device/ref, made by ../shared/tools/nccl-reference 2.32.3 90 .device/ref), with one
# rank and with two ranks of one process (group calls), then, where `perf` exists, a profile of
# ours on the 8-byte all-reduce. Writes under ${OUT:-/tmp/hostpath}: <lib>-<ranks>.txt (ROW
# lines: host µs per call, stream µs per operation), side-by-side.txt, perf-*.txt, all packed
# as hostpath.tar.gz.
# usage: scripts/hostpath.sh [ITERATIONS]   (calls per case, default 2000)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hostpath}
mkdir -p "$OUT"
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
for ranks in 1 2; do
  for entry in "${libs[@]}"; do
    name=${entry%%=*} dir=${entry#*=}
    LD_LIBRARY_PATH=$dir timeout -k 5 150 .device/bin/hostpath -r "$ranks" -n "$N" >"$OUT/$name-$ranks.txt" 2>"$OUT/$name-$ranks.err"
    echo "rc=$? $name ranks=$ranks: $(grep -c '^ROW' "$OUT/$name-$ranks.txt") rows" | tee -a "$OUT/runs.txt"
  done
done
# Side by side: one line per case, host and stream µs of each library.
python3 - "$OUT" "${libs[@]}" >"$OUT/side-by-side.txt" <<'PY'
import sys, re, os
out, libs = sys.argv[1], [l.split('=')[0] for l in sys.argv[2:]]
rows = {}
for ranks in (1, 2):
    for lib in libs:
        path = os.path.join(out, f"{lib}-{ranks}.txt")
        if not os.path.exists(path):
            continue
        for line in open(path):
            m = re.match(r"ROW (\d+) (\S+)\s+(\d+) (\S+)\s+host=([\d.]+) stream=([\d.]+)", line)
            if m:
                key = (int(m[1]), m[2], int(m[3]), m[4])
                rows.setdefault(key, {})[lib] = (float(m[5]), float(m[6]))
print("ranks collective bytes place | " + " | ".join(f"{l} host/stream" for l in libs) + " | ours stream / best NVIDIA")
for key in sorted(rows):
    r = rows[key]
    cells = " | ".join("%.2f / %.2f" % r[l] if l in r else "-" for l in libs)
    nv = [r[l][1] for l in libs if l != "ours" and l in r]
    ratio = "%.2f" % (r["ours"][1] / min(nv)) if "ours" in r and nv else "-"
    print(f"{key[0]} {key[1]} {key[2]} {key[3]} | {cells} | {ratio}")
PY
cat "$OUT/side-by-side.txt"
if command -v perf >/dev/null; then
  for ranks in 1 2; do
    LD_LIBRARY_PATH=.device/lib timeout 120 perf record -F 15000 -g -o "$OUT/perf-$ranks.data" -- \
      .device/bin/hostpath -r "$ranks" -n 20000 -c allreduce -s 8 >"$OUT/perf-run-$ranks.txt" 2>&1
    perf report -i "$OUT/perf-$ranks.data" --stdio --no-children --percent-limit 0.5 2>/dev/null | head -400 >"$OUT/perf-$ranks.txt"
    perf report -i "$OUT/perf-$ranks.data" --stdio --children --percent-limit 1 -g none 2>/dev/null | head -200 >"$OUT/perf-children-$ranks.txt"
    rm -f "$OUT/perf-$ranks.data"
  done
else
  echo "no perf on this machine: no profile" | tee "$OUT/perf-1.txt"
fi
tar -czf "$OUT.tar.gz" -C "$OUT" . && mv "$OUT.tar.gz" "$OUT/hostpath.tar.gz"
