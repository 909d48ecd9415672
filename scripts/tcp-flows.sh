#!/usr/bin/env bash
# How many TCP connections a shaped link takes before a collective's bytes stall on
# retransmissions: two network namespaces joined by one veth shaped with tc tbf as
# scripts/links-bench.sh shapes its links (RATE Mbit/s, a 10 ms burst, a 50 ms queue); a client
# in one namespace sends TOTAL bytes spread evenly over N connections at once, waits until the
# server has all of them, and repeats; prints each round's rate in Mbit/s and the median, per
# N. No GPU and no oxccl: plain TCP (python3), the traffic shape of a ring collective over N
# channels. Backs `cost::NET_CHANNELS_PER_GBIT` (docs/weights.md).
#
# usage: scripts/tcp-flows.sh   (root, ip, tc, python3)
# env:   RATE=1000 (Mbit/s), CASES="64:16 32:16 16:16 8:16 2:16 64:64" (connections:MiB),
#        ROUNDS=12
set -u
RATE=${RATE:-1000} ROUNDS=${ROUNDS:-12}
CASES=${CASES:-"64:16 32:16 16:16 8:16 2:16 64:64"}
for tool in ip tc python3; do
  command -v "$tool" >/dev/null || { echo "tcp-flows: needs $tool"; exit 2; }
done
a=oxccl-tf-$$-a b=oxccl-tf-$$-b
work=$(mktemp -d) || exit 2
cleanup() { ip netns delete "$a" 2>/dev/null; ip netns delete "$b" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
burst=$((RATE * 1000000 / 8 / 100))
[ "$burst" -ge 262144 ] || burst=262144
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
    rates = []
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
        rates.append(total * 8 / (time.time() - t0) / 1e6)
    print(f"{n:3d} connections, {total >> 20:3d} MiB a round: median {statistics.median(rates):5.0f} Mbit/s; rounds: "
          + " ".join(f"{r:.0f}" for r in rates), flush=True)
EOF
echo "tcp-flows: one link of $RATE Mbit/s (tbf, burst $burst B, 50 ms queue), $ROUNDS rounds per case"
port=5400
status=0
for case in $CASES; do
  n=${case%%:*} mib=${case#*:} port=$((port + 1))
  ip netns exec "$b" timeout 300 python3 "$work/flows.py" server 10.213.90.2 "$port" "$n" $((mib << 20)) "$ROUNDS" >"$work/server.out" 2>&1 &
  server=$!
  for _ in $(seq 50); do grep -q ready "$work/server.out" 2>/dev/null && break; sleep 0.1; done
  ip netns exec "$a" timeout 300 python3 "$work/flows.py" client 10.213.90.2 "$port" "$n" $((mib << 20)) "$ROUNDS" || status=1
  wait "$server" || status=1
done
exit $status
