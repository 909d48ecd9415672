#!/usr/bin/env bash
# Two "machines" on one GPU machine: two network namespaces joined by a veth pair
# (10.213.77.1/30 and .2, nothing else), each rank a process in its own namespace with its own
# hostname (UTS namespace), so the libraries see two hosts by name, without NCCL_HOSTID, and
# must find the veth interface by themselves (no NCCL_SOCKET_IFNAME). Both ranks use GPU 0.
# Runs scripts/two-hosts.py (torch, 2 ranks: all_reduce, all_gather, broadcast, send/recv,
# exact) under NVIDIA's library and under ours (LD_PRELOAD). Root and iproute2 needed
# (IP=/path/to/ip, else ip on PATH).
# usage: scripts/two-hosts.sh OURS_LIB [NVIDIA_LIB]   (prints "N passed, M failed")
set -u
ours=$1 nv=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
IP=${IP:-ip}
if ! $py -c 'import torch' >/dev/null 2>&1; then
  echo "two-hosts: $py cannot import torch; skipped"
  echo "0 passed, 0 failed"
  exit 0
fi
a=oxccl-2h-$$-a b=oxccl-2h-$$-b
cleanup() { "$IP" netns delete "$a" 2>/dev/null; "$IP" netns delete "$b" 2>/dev/null; }
trap cleanup EXIT
if ! { "$IP" netns add "$a" && "$IP" netns add "$b" &&
  "$IP" link add oxv0 netns "$a" type veth peer name oxv1 netns "$b" &&
  "$IP" -n "$a" addr add 10.213.77.1/30 dev oxv0 && "$IP" -n "$b" addr add 10.213.77.2/30 dev oxv1 &&
  "$IP" -n "$a" link set oxv0 up && "$IP" -n "$b" link set oxv1 up &&
  "$IP" -n "$a" link set lo up && "$IP" -n "$b" link set lo up; }; then
  echo "two-hosts: network namespaces cannot be made here; skipped"
  echo "0 passed, 0 failed"
  exit 0
fi
passed=0 failed=0
# What would pin the ranks to one host or one interface (the one-GPU suite exports
# NCCL_SOCKET_IFNAME=lo): the ranks start without them.
UNSET="NCCL_SOCKET_IFNAME NCCL_SOCKET_FAMILY NCCL_HOSTID NCCL_COMM_ID NCCL_NET NCCL_NET_PLUGIN"
# run LABEL ENV... : both ranks, each in its namespace and hostname; pass iff both print OK
# and each names its veth interface in NCCL's INFO lines.
run() {
  local label=$1
  shift
  local port=$((29500 + RANDOM % 1000)) pids=() r ns ok=1
  for r in 0 1; do
    ns=$a
    [ "$r" = 1 ] && ns=$b
    "$IP" netns exec "$ns" unshare --uts sh -c "unset LD_LIBRARY_PATH $UNSET; hostname two-hosts-$r && exec env $* \
      MASTER_ADDR=10.213.77.1 MASTER_PORT=$port NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,BOOTSTRAP \
      NCCL_NVLS_ENABLE=0 timeout 60 $py $here/two-hosts.py $r" >"$OUTDIR/$label-$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || ok=0; done
  for r in 0 1; do
    grep -q "TWO_HOSTS_OK rank $r" "$OUTDIR/$label-$r.log" || ok=0
    # the library the label names ran (ours logs "NCCL version 2.32.3+oxccl")
    if [ "$label" = ours ]; then grep -q '+oxccl' "$OUTDIR/$label-$r.log" || ok=0
    else ! grep -q '+oxccl' "$OUTDIR/$label-$r.log" || ok=0; fi
    grep -q "NET/Socket : Using \[0\]oxv$r:10.213.77.$((r + 1))" "$OUTDIR/$label-$r.log" || ok=0
  done
  if [ $ok = 1 ]; then
    passed=$((passed + 1))
    echo "PASS $label: $(grep -h -m1 -o 'via NET/Socket/[0-9]*' "$OUTDIR/$label-0.log" || echo 'no via line')"
  else
    failed=$((failed + 1))
    echo "FAIL $label (logs: $OUTDIR/$label-*.log)"
    tail -n 5 "$OUTDIR/$label-0.log" "$OUTDIR/$label-1.log"
  fi
}
OUTDIR=${OUTDIR:-$(mktemp -d)}
mkdir -p "$OUTDIR"
if [ -n "$nv" ]; then run nvidia "LD_LIBRARY_PATH=$(dirname "$nv")"; fi
run ours "LD_PRELOAD=$ours"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
