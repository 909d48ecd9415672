#!/usr/bin/env bash
# How many TCP connections a shaped link takes before a collective's bytes stall on
# retransmissions: two network namespaces joined by one veth shaped with tc tbf as
# scripts/links-bench.sh shapes its links (RATE Mbit/s, a 10 ms burst, a 50 ms queue); a client
# in one namespace sends TOTAL bytes spread evenly over N connections at once, waits until the
# server has all of them, and repeats; prints each round's rate in Mbit/s and the median, per
# N. No GPU and no oxccl: plain TCP (python3), the traffic shape of a ring collective over N
# channels. Backs `cost::NET_CHANNELS_PER_GBIT` (docs/weights.md).
#
# With CUT_TO (Mbit/s) the link is reshaped to that rate CUT_AT_S seconds into each case's
# first round (as links-bench.sh cuts its fast link while collectives run) and back to RATE
# before the next case; each round's rate is then printed with its start relative to the cut,
# so a round stalled on retransmissions after the cut shows against the rounds beside it.
#
# usage: scripts/tcp-flows.sh   (root, ip, tc, python3)
# env:   RATE=1000 (Mbit/s), CASES="64:16 32:16 16:16 8:16 2:16 64:64" (connections:MiB),
#        ROUNDS=12, CUT_TO (unset: no cut), CUT_AT_S=1
set -u
RATE=${RATE:-1000} ROUNDS=${ROUNDS:-12} CUT_TO=${CUT_TO:-} CUT_AT_S=${CUT_AT_S:-1}
CASES=${CASES:-"64:16 32:16 16:16 8:16 2:16 64:64"}
for tool in ip tc python3; do
  command -v "$tool" >/dev/null || { echo "tcp-flows: needs $tool"; exit 2; }
done
a=oxccl-tf-$$-a b=oxccl-tf-$$-b
work=$(mktemp -d) || exit 2
cleanup() { ip netns delete "$a" 2>/dev/null; ip netns delete "$b" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
# burst_of MBIT: 10 ms of the rate, at least 256 KiB.
burst_of() {
  local b=$(($1 * 1000000 / 8 / 100))
  [ "$b" -ge 262144 ] || b=262144
  echo "$b"
}
burst=$(burst_of "$RATE")
# reshape MBIT: both ends of the link to MBIT Mbit/s while it carries traffic.
reshape() {
  tc -n "$a" qdisc change dev tf0 root tbf rate "${1}mbit" burst "$(burst_of "$1")" latency 50ms &&
    tc -n "$b" qdisc change dev tf1 root tbf rate "${1}mbit" burst "$(burst_of "$1")" latency 50ms
}
if ! { ip netns add "$a" && ip netns add "$b" &&
  ip link add tf0 netns "$a" type veth peer name tf1 netns "$b" &&
  ip -n "$a" addr add 10.213.90.1/30 dev tf0 && ip -n "$b" addr add 10.213.90.2/30 dev tf1 &&
  ip -n "$a" link set tf0 up && ip -n "$b" link set tf1 up &&
  tc -n "$a" qdisc add dev tf0 root tbf rate "${RATE}mbit" burst "$burst" latency 50ms &&
  tc -n "$b" qdisc add dev tf1 root tbf rate "${RATE}mbit" burst "$burst" latency 50ms; }; then
  echo "tcp-flows: cannot make the namespaces and the shaped link here (root, ip, tc)"
  exit 2
fi
cat >"$work/flows.py" <<'EOF'
import socket, statistics, sys, threading, time

role, host, port, n, total, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
per = total // n
if role == "server":
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(n)
    print("ready", flush=True)
    conns = [listener.accept()[0] for _ in range(n)]

    def receive(c):
        buf = bytearray(1 << 20)
        for _ in range(rounds):
            got = 0
            while got < per:
                k = c.recv_into(buf, min(len(buf), per - got))
                if k == 0:
                    return
                got += k
            c.sendall(b"a")

    threads = [threading.Thread(target=receive, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
else:
    conns = [socket.create_connection((host, port), timeout=60) for _ in range(n)]
    data = b"x" * per
    rates, starts = [], []
    cut_file = sys.argv[7] if len(sys.argv) > 7 else ""
    if cut_file:
        # The shell waits for this file, sleeps CUT_AT_S and reshapes the link, then writes
        # the cut's time into it.
        open(cut_file + ".go", "w").write(repr(time.time()))
    for _ in range(rounds):
        start = threading.Barrier(n + 1)

        def send(c):
            start.wait()
            c.sendall(data)
            c.recv(1)

        threads = [threading.Thread(target=send, args=(c,)) for c in conns]
        for t in threads:
            t.start()
        t0 = time.time()
        start.wait()
        for t in threads:
            t.join()
        starts.append(t0)
        rates.append(total * 8 / (time.time() - t0) / 1e6)
    line = f"{n:3d} connections, {total >> 20:3d} MiB a round: median {statistics.median(rates):5.0f} Mbit/s; rounds: "
    if cut_file:
        for _ in range(100):
            try:
                cut = float(open(cut_file).read())
                break
            except (OSError, ValueError):
                time.sleep(0.1)
        else:
            cut = None
        if cut is not None:
            after = [r for r, t in zip(rates, starts) if t >= cut]
            line = (f"{n:3d} connections, {total >> 20:3d} MiB a round, cut at {cut - starts[0]:.2f} s: "
                    f"after the cut median {statistics.median(after) if after else 0:5.0f}, "
                    f"least {min(after) if after else 0:5.0f} Mbit/s; rounds (start s from the cut: Mbit/s): ")
            print(line + " ".join(f"{t - cut:+.2f}:{r:.0f}" for r, t in zip(rates, starts)), flush=True)
            sys.exit(0)
    print(line + " ".join(f"{r:.0f}" for r in rates), flush=True)
EOF
echo "tcp-flows: one link of $RATE Mbit/s (tbf, burst $burst B, 50 ms queue), $ROUNDS rounds per case${CUT_TO:+, cut to $CUT_TO Mbit/s $CUT_AT_S s into the first round}"
port=5400
status=0
for case in $CASES; do
  n=${case%%:*} mib=${case#*:} port=$((port + 1))
  ip netns exec "$b" timeout 300 python3 "$work/flows.py" server 10.213.90.2 "$port" "$n" $((mib << 20)) "$ROUNDS" >"$work/server.out" 2>&1 &
  server=$!
  for _ in $(seq 50); do grep -q ready "$work/server.out" 2>/dev/null && break; sleep 0.1; done
  cutter=
  rm -f "$work/cut" "$work/cut.go"
  if [ -n "$CUT_TO" ]; then
    (for _ in $(seq 600); do [ -f "$work/cut.go" ] && break; sleep 0.05; done
      sleep "$CUT_AT_S"
      reshape "$CUT_TO" && python3 -c 'import time; print(repr(time.time()))' >"$work/cut.tmp" && mv "$work/cut.tmp" "$work/cut") &
    cutter=$!
  fi
  ip netns exec "$a" timeout 300 python3 "$work/flows.py" client 10.213.90.2 "$port" "$n" $((mib << 20)) "$ROUNDS" \
    ${CUT_TO:+"$work/cut"} || status=1
  wait "$server" || status=1
  if [ -n "$cutter" ]; then
    wait "$cutter" || status=1
    reshape "$RATE" || status=1
  fi
done
exit $status
