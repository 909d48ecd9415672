#!/usr/bin/env bash
# A net plugin hung in a call must not hang ncclCommAbort: 2 ranks forced onto the network in
# one process on GPU 0 over the test plugin, which stops returning from test once 200 requests
# have completed (OXTEST_HOLD_AFTER=200). The collective cannot finish; oxccl-bench's case
# timeout aborts both communicators, and each abort must return (oxccl leaves the held proxy
# thread behind after 5 s, with a WARN), where NVIDIA's library waits for the call.
# usage: scripts/held-plugin-abort.sh BENCH LIB PLUGIN   (prints "N passed, M failed")
set -u
bench=$1 lib=$2 plugin=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT
env NCCL_SOCKET_IFNAME=lo NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
  NCCL_NET_PLUGIN="$plugin" NCCL_NET=OxTest OXTEST_HOLD_AFTER=200 NCCL_DEBUG=WARN \
  "$bench" --lib "$lib" --devices 0,0 -c all_reduce -d float -o sum -b 1M -e 1M --inplace 0 \
  --check 0 -w 0 -n 50 --timeout 10 >"$log" 2>&1
rc=$?
cat "$log"
passed=0 failed=0
check() { # WHAT COMMAND...
  local what=$1
  shift
  if "$@"; then passed=$((passed + 1)); echo "PASS $what"; else failed=$((failed + 1)); echo "FAIL $what"; fi
}
check "the plugin held a call" grep -q "OXTEST_HOLD_AFTER=200: this test call never returns" "$log"
check "the collective timed out (bench exit $rc)" grep -q "did not complete within" "$log"
check "every ncclCommAbort returned" bash -c "! grep -q 'ncclCommAbort.*did not return in time' '$log'"
check "the held proxy thread was left behind, named" grep -q "the proxy thread did not stop within .* left behind" "$log"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
