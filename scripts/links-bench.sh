#!/usr/bin/env bash
# Two links of unequal speed between two "hosts": two network namespaces joined by two veth
# links (fast: 10.213.81.1/30 - .2, slow: 10.213.82.1/30 - .2, addresses that exist only inside
# the namespaces), each shaped with tc tbf (default 4000 and 1000 Mbit/s, both directions).
# One rank in each namespace (both on GPU 0, NCCL_HOSTID per rank) runs a 2-rank float
# all_reduce (oxccl-bench, out of place) over the socket network, with NCCL_SOCKET_IFNAME =
# the fast link only, the slow link only, and both; for every library given, and for ours also
# with OXCCL_WEIGHTED_CHANNELS=0 (even split, NVIDIA's way). Prints busbw (GB/s) at 16 and
# 64 MiB. The veths report 10000 Mbit/s whatever tc does, so ours is told the shaped rates
# (OXCCL_NET_SPEEDS); NVIDIA's ignores that setting.
#
# usage: scripts/links-bench.sh OURS_LIB [NVIDIA_LIB ...]
# env:   CUT_AFTER_S, CUT_TO (Mbit/s, default 1000): cut the fast link mid-run (runs over
#        both links only; ITERS must make the run last well past CUT_AFTER_S);
#        MODES="fast slow both" (which links each row runs over), EVEN=1 (0: no
#        oxccl-even row), SIZES=16M,64M (the table shows 16 and 64 MiB),
#        FAST=4000 SLOW=1000 (Mbit/s), BENCH (default .device/bin/oxccl-bench, else
#        target/release/oxccl-bench), IP and TC (default .device/iproute/ipw and tcw as
#        scripts/stage-device bundles them, else ip and tc on PATH), PYTHON (python3, to make
#        each library's unique id), ITERS=10, OUTDIR (where links-bench.tar.gz, every log of
#        the run, is left; default a temporary folder),
#        OURS_ENV ("A=1 B=2;C=3": a row of ours per ';'-separated set of settings),
#        TRACE_MS (off by default): the bench prints busbw every TRACE_MS ms while each size
#        runs (`# trace` lines, kept in the logs); with CUT_AFTER_S each row over both links
#        is followed by a "recover" line: busbw before the cut, the new ideal (that busbw
#        scaled by the links' capacity after/before the cut), and how long after the cut
#        busbw came back to within 10% of it and stayed there (per interval, and over every
#        1 s window from then on); RESTORE_AFTER_S: that many s after the cut the fast
#        link gets its rate back, and a "restore" line says the same of the way back to the
#        busbw before the cut.
# Needs root. Exits non-zero when a run fails (its logs are named).
set -u
[ $# -ge 1 ] || { sed -n '2,/^# Needs root/p' "$0"; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
FAST=${FAST:-4000} SLOW=${SLOW:-1000} ITERS=${ITERS:-10}
MODES=${MODES:-fast slow both} SIZES=${SIZES:-16M,64M}
py=${PYTHON:-python3}
pick() { for c in "$@"; do if [ -x "$c" ] || command -v "$c" >/dev/null 2>&1; then echo "$c"; return; fi; done; }
BENCH=${BENCH:-$(pick "$root/.device/bin/oxccl-bench" "$root/target/release/oxccl-bench")}
IP=${IP:-$(pick "$root/.device/iproute/ipw" ip)}
TC=${TC:-$(pick "$root/.device/iproute/tcw" tc)}
[ -n "$BENCH" ] || { echo "links-bench: no oxccl-bench (set BENCH)"; exit 2; }
[ -n "$IP" ] && [ -n "$TC" ] || { echo "links-bench: needs ip and tc (set IP, TC)"; exit 2; }
OUTDIR=${OUTDIR:-$(mktemp -d)}
mkdir -p "$OUTDIR"

a=oxccl-lb-$$-a b=oxccl-lb-$$-b
cleanup() { "$IP" netns delete "$a" 2>/dev/null; "$IP" netns delete "$b" 2>/dev/null; }
trap cleanup EXIT
# link END SUBNET: veth END0 in a (SUBNET.1/30), END1 in b (SUBNET.2/30), up.
link() {
  "$IP" link add "${1}0" netns "$a" type veth peer name "${1}1" netns "$b" &&
    "$IP" -n "$a" addr add "$2.1/30" dev "${1}0" && "$IP" -n "$b" addr add "$2.2/30" dev "${1}1" &&
    "$IP" -n "$a" link set "${1}0" up && "$IP" -n "$b" link set "${1}1" up
}
# reshape END MBIT: change both ends' egress of a shaped link to MBIT Mbit/s while it runs.
reshape() {
  local burst=$(($2 * 1000000 / 8 / 100)) ns end
  [ "$burst" -ge 262144 ] || burst=262144
  for ns in "$a" "$b"; do
    end=${1}0
    [ "$ns" = "$b" ] && end=${1}1
    "$TC" -n "$ns" qdisc change dev "$end" root tbf rate "${2}mbit" burst "$burst" latency 50ms || return 1
  done
}
# shape END MBIT: both ends' egress at MBIT Mbit/s (a burst of 10 ms, at least 256 KiB).
shape() {
  local burst=$(($2 * 1000000 / 8 / 100)) ns end
  [ "$burst" -ge 262144 ] || burst=262144
  for ns in "$a" "$b"; do
    end=${1}0
    [ "$ns" = "$b" ] && end=${1}1
    "$TC" -n "$ns" qdisc add dev "$end" root tbf rate "${2}mbit" burst "$burst" latency 50ms || return 1
  done
}
if ! { "$IP" netns add "$a" && "$IP" netns add "$b" && link oxf 10.213.81 && link oxs 10.213.82 &&
  "$IP" -n "$a" link set lo up && "$IP" -n "$b" link set lo up; }; then
  echo "links-bench: network namespaces cannot be made here"
  exit 2
fi
shape oxf "$FAST" && shape oxs "$SLOW" || { echo "links-bench: tc cannot shape the links"; exit 2; }
sleep 1 # carriers up

SPEEDS="oxf0=$FAST,oxf1=$FAST,oxs0=$SLOW,oxs1=$SLOW"
UNSET="NCCL_SOCKET_IFNAME NCCL_SOCKET_FAMILY NCCL_HOSTID NCCL_COMM_ID NCCL_NET NCCL_NET_PLUGIN LD_PRELOAD"
failed=0

# uid LIB ENV...: LIB's unique id for NCCL_COMM_ID (in namespace a, where rank 0 runs): with
# NCCL_COMM_ID set it names that address and starts nothing, so the ranks can use it later.
# The id comes on a line of its own (UID=...): a library may log to stdout too.
uid() {
  local lib=$1
  shift
  "$IP" netns exec "$a" env -u LD_PRELOAD "$@" "$py" -c '
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
buf = ctypes.create_string_buffer(128)
rc = lib.ncclGetUniqueId(buf)
sys.exit("ncclGetUniqueId: %d" % rc) if rc else print("UID=" + buf.raw.hex(), flush=True)' "$lib" |
    sed -n 's/^UID=//p'
}

# recover LOG CUT_UNIX [RESTORE_UNIX]: from a rank's trace lines (oxccl-bench
# --trace-interval), how busbw came back after the fast link was cut at CUT_UNIX (wall-clock
# s), in the traced size that was running then: one "recover ..." line; with RESTORE_UNIX (the
# link given its rate back), the cut's window ends there and a "restore ..." line says how
# busbw came back to what it was before the cut.
recover() {
  "$py" - "$1" "$2" "${3:-0}" "$FAST" "$SLOW" "${CUT_TO:-1000}" <<'PY'
import re, sys
log, cut, restore, fast, slow, cut_to = sys.argv[1], *map(float, sys.argv[2:])
traces, cur = [], None
for line in open(log, errors="replace"):
    m = re.match(r"# trace start size=(\d+) unix=([\d.]+)", line)
    if m:
        cur = (int(m.group(1)), float(m.group(2)), [])
        traces.append(cur)
        continue
    m = re.match(r"# trace t=([\d.]+) busbw=([\d.]+) iters=(\d+)", line)
    if m and cur:
        cur[2].append((float(m.group(1)), float(m.group(2))))
hit = [t for t in traces if t[2] and t[1] <= cut <= t[1] + t[2][-1][0]]
if not hit:
    print("recover: the cut fell outside every traced size (raise ITERS or lower CUT_AFTER_S)")
    sys.exit(0)
size, start, pts = hit[0]
c = cut - start
r = restore - start if restore else float("inf")
full = pts[:-1] or pts  # the last interval is partial
before = sorted(b for t, b in full if t <= c)
after = [(t, b) for t, b in full if c < t <= r]
if not before or not after:
    print(f"recover: {size >> 20} MiB: too few intervals before or after the cut at t={c:.2f} s")
    sys.exit(0)
was = before[len(before) // 2]

def report(what, event, t0, ideal, after, head):
    """How busbw came back to within 10% of `ideal` over `after` (the intervals after `event`
    at t0): for good per interval, and over every 1 s window from then on (the mean of the
    intervals in it, so that a single collective's dip, such as a TCP retransmission, no
    longer counts alone)."""
    settled = sorted(b for t, b in after[-max(1, len(after) // 3):])
    settled = settled[len(settled) // 2]
    back = next((t for i, (t, b) in enumerate(after) if all(x >= 0.9 * ideal for _, x in after[i:])), None)
    when = f"within 10% of it {back - t0:.2f} s after the {event}" if back is not None else \
        f"not back within 10% of it by t={after[-1][0] - t0:.2f} s after the {event}"
    def window_ok(u0):
        win = [b for t, b in after if u0 <= t < u0 + 1.0]
        return not win or sum(win) / len(win) >= 0.9 * ideal
    ends = [t for t, _ in after if t <= after[-1][0] - 1.0]
    wback = next((t for t in ends if all(window_ok(u) for u in ends if u >= t)), None)
    wwhen = f"{wback - t0:.2f} s after the {event}" if wback is not None else "not by the end"
    print(f"{what}: {size >> 20} MiB, {head}, settled {settled:.3f}; {when}; "
          f"over 1 s windows within 10% from {wwhen}")

ideal = was * (cut_to + slow) / (fast + slow)
report("recover", "cut", c, ideal, after,
       f"cut at t={c:.2f} s: busbw before {was:.3f} GB/s, new ideal {ideal:.3f}")
if restore:
    again = [(t, b) for t, b in full if t > r]
    if len(again) < 2:
        print(f"restore: {size >> 20} MiB: too few intervals after the restore at t={r:.2f} s")
    else:
        report("restore", "restore", r, was, again,
               f"restored at t={r:.2f} s: ideal {was:.3f} GB/s (busbw before the cut)")
PY
}

# run LABEL LIB IFNAME ENV...: one 2-rank run; prints "size busbw" lines (bytes, GB/s), and
# with a cut and TRACE_MS a "recover ..." line.
run() {
  local label=$1 lib=$2 ifname=$3
  # Log names keep to letters, digits, dots, dashes and underscores (a row's label may hold
  # settings: OXCCL_X=1+NCCL_DEBUG=TRACE), so that every tool that copies them takes them.
  local file=${label//[^A-Za-z0-9._-]/_}
  shift 3
  local port=$((30000 + RANDOM % 2000)) r ns pids=() ok=1 hex log trace=()
  [ -n "${TRACE_MS:-}" ] && trace=(--trace-interval "$TRACE_MS")
  local env=(NCCL_COMM_ID=10.213.81.1:$port NCCL_SOCKET_IFNAME=$ifname OXCCL_NET_SPEEDS=$SPEEDS
    NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@")
  if ! hex=$(set -o pipefail; uid "$lib" "${env[@]}" 2>"$OUTDIR/$file-uid.log") || [ -z "$hex" ]; then
    echo "FAIL $label: no unique id ($OUTDIR/$file-uid.log)" >&2
    return 1
  fi
  for r in 0 1; do
    ns=$a
    [ "$r" = 1 ] && ns=$b
    "$IP" netns exec "$ns" sh -c "unset $UNSET; exec env \"\$@\"" sh "${env[@]}" NCCL_HOSTID=links-bench-$r \
      "$BENCH" --lib "$lib" -c all_reduce -d float -o sum --sizes "$SIZES" --inplace 0 --devices 0,0 \
      -w 3 -n "$ITERS" --timeout 300 ${trace[@]+"${trace[@]}"} --child-rank "$r" --child-nranks 2 --child-id "$hex" \
      >"$OUTDIR/$file-$r.log" 2>&1 &
    pids+=($!)
  done
  # CUT_AFTER_S=N CUT_TO=MBIT: N s into a run over both links, the fast link drops to MBIT
  # (restored RESTORE_AFTER_S s later, or after the run); ranks log the weights as they change
  # (NCCL_DEBUG_SUBSYS NET).
  local cutter= cutfile=$OUTDIR/$file-cut.txt restorefile=$OUTDIR/$file-restore.txt
  rm -f "$cutfile" "$restorefile"
  if [ -n "${CUT_AFTER_S:-}" ] && [ "$ifname" = oxf,oxs ]; then
    (sleep "$CUT_AFTER_S" && reshape oxf "${CUT_TO:-1000}" && date +%s.%N >"$cutfile" &&
      echo "links-bench: $label: fast link cut to ${CUT_TO:-1000} Mbit/s at $(cat "$cutfile")" >&2 &&
      if [ -n "${RESTORE_AFTER_S:-}" ]; then
        sleep "$RESTORE_AFTER_S" && reshape oxf "$FAST" && date +%s.%N >"$restorefile" &&
          echo "links-bench: $label: fast link back at $FAST Mbit/s at $(cat "$restorefile")" >&2
      fi) &
    cutter=$!
  fi
  for r in 0 1; do wait "${pids[$r]}" || ok=0; done
  if [ -n "$cutter" ]; then
    kill "$cutter" 2>/dev/null
    wait "$cutter" 2>/dev/null
    reshape oxf "$FAST"
  fi
  if [ $ok = 0 ] || grep -q 'wrong=[1-9]' "$OUTDIR/$file-0.log" "$OUTDIR/$file-1.log"; then
    echo "FAIL $label (logs: $OUTDIR/$file-[01].log)" >&2
    tail -n 3 "$OUTDIR/$file-0.log" "$OUTDIR/$file-1.log" >&2
    return 1
  fi
  # Each size's time is the slower rank's; all_reduce of 2 ranks: busbw = algbw = bytes / time.
  cat "$OUTDIR/$file-0.log" "$OUTDIR/$file-1.log" | awk '
    /^@@OXCCL res / { s = b = t = 0
      for (i = 3; i <= NF; i++) { split($i, kv, "=")
        if (kv[1] == "size") s = kv[2]; if (kv[1] == "bytes") b = kv[2]; if (kv[1] == "time_us") t = kv[2] }
      if (t > worst[s]) worst[s] = t; bytes[s] = b }
    END { for (s in worst) printf "%s %.3f\n", s, bytes[s] / worst[s] / 1e3 }'
  if [ -n "${TRACE_MS:-}" ] && [ -s "$cutfile" ]; then
    recover "$OUTDIR/$file-0.log" "$(cat "$cutfile")" "$(cat "$restorefile" 2>/dev/null)"
  fi
  # A run that succeeded may still have warned (a false hang report, a failed exchange).
  local warns
  warns=$(cat "$OUTDIR/$file-0.log" "$OUTDIR/$file-1.log" | grep -c 'NCCL WARN')
  [ "$warns" = 0 ] || echo "warn: $warns WARN lines, first: $(grep -h -m1 'NCCL WARN' "$OUTDIR/$file-0.log" \
    "$OUTDIR/$file-1.log" | head -1 | sed 's/.*NCCL WARN //' | cut -c1-140)"
}

libs=()
for lib in "$@"; do
  lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
  libs+=("$lib")
done
printf '%-22s %-5s %12s %12s\n' library links 'busbw 16MiB' 'busbw 64MiB'
row() { # LABEL LIB ENV...
  local label=$1 lib=$2 mode ifname out
  shift 2
  for mode in $MODES; do
    case $mode in fast) ifname=oxf ;; slow) ifname=oxs ;; both) ifname=oxf,oxs ;; esac
    if out=$(run "$label-$mode" "$lib" "$ifname" "$@"); then
      printf '%-22s %-5s %12s %12s\n' "$label" "$mode" \
        "$(echo "$out" | awk '$1 == 16777216 {print $2}')" "$(echo "$out" | awk '$1 == 67108864 {print $2}')"
      echo "$out" | sed -n 's/^recover: /    recover: /p; s/^restore: /    restore: /p; s/^warn: /    warn: /p'
    else
      printf '%-22s %-5s %12s %12s\n' "$label" "$mode" FAIL FAIL
      failed=$((failed + 1))
    fi
  done
}
row oxccl "${libs[0]}"
[ "${EVEN:-1}" = 0 ] || row oxccl-even "${libs[0]}" OXCCL_WEIGHTED_CHANNELS=0
# OURS_ENV="A=1 B=2;C=3": one more row of ours per ';'-separated set of settings.
IFS=';' read -r -a extra <<<"${OURS_ENV:-}"
for set in "${extra[@]}"; do
  [ -n "${set// /}" ] || continue
  read -r -a vars <<<"$set"
  row "oxccl+${set// /+}" "${libs[0]}" "${vars[@]}"
done
n=0
for lib in "${libs[@]:1}"; do
  n=$((n + 1))
  row "nvidia$n" "$lib"
done
# Every log into one archive (a device call returns only a few files): OUTDIR keeps
# links-bench.tar.gz alone. The archive is written outside OUTDIR and moved in: tar refuses a
# folder that grows while it reads it.
part=$(mktemp "${TMPDIR:-/tmp}/links-bench.XXXXXX.tar.gz")
if (cd "$OUTDIR" && tar -czf "$part" --exclude 'links-bench.tar.gz' . &&
  find . -maxdepth 1 -type f ! -name 'links-bench.tar.gz' -delete && mv "$part" links-bench.tar.gz); then
  echo "rates: fast $FAST Mbit/s, slow $SLOW Mbit/s; logs: $OUTDIR/links-bench.tar.gz"
else
  rm -f "$part"
  echo "rates: fast $FAST Mbit/s, slow $SLOW Mbit/s; logs: $OUTDIR (not packed)"
fi
[ "$failed" = 0 ]
