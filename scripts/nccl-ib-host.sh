#!/usr/bin/env bash
# nccl-ib-host.sh: NVIDIA's own IB transport (net_ib.cc and what it links to, compiled from
# NVIDIA's NCCL sources) over the software verbs device, on this machine, no GPU:
# ffi-tests/ibverbs/nccl_ib_host.cc drives ncclNetIb between two processes with host memory.
# Nothing of NVIDIA's is kept in this repository: the sources are read from SRC.
# Usage: scripts/nccl-ib-host.sh SRC
#   SRC  an NVIDIA NCCL source tree (with src/transport/net_ib.cc), or a git directory of
#        github.com/NVIDIA/nccl, read at tag NCCL_TAG (default v2.28.9-1) with git archive
#   CUDA_INC  CUDA headers (default .toolchain/py/nvidia/cu13/include; only headers are used)
#   OUT  build and log directory (default /tmp/nccl-ib-host)
# Exit status: the test's (0 all passed); 2 when it cannot be built (the message says why).
set -uo pipefail
src=${1:?usage: scripts/nccl-ib-host.sh SRC (NVIDIA NCCL source tree or git dir)}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/nccl-ib-host}
cuda_inc=${CUDA_INC:-$root/.toolchain/py/nvidia/cu13/include}
tag=${NCCL_TAG:-v2.28.9-1}
mkdir -p "$out" || exit 2
if [ -f "$src/src/transport/net_ib.cc" ]; then
  nccl=$(cd "$src" && pwd)
elif git --git-dir="$src" rev-parse -q --verify "$tag^{commit}" >/dev/null 2>&1; then
  rm -rf "$out/nccl" && mkdir -p "$out/nccl"
  git --git-dir="$src" archive "$tag" src | tar x -C "$out/nccl" || exit 2
  nccl=$out/nccl
else
  echo "nccl-ib-host: $src is neither an NCCL source tree nor a git dir with tag $tag" >&2
  exit 2
fi
[ -d "$cuda_inc" ] || { echo "nccl-ib-host: no CUDA headers at $cuda_inc (set CUDA_INC)" >&2; exit 2; }
ver=$(sed -n 's/^NCCL_\(MAJOR\|MINOR\|PATCH\) *:= *//p' "$nccl/makefiles/version.mk" 2>/dev/null | paste -sd. -)
mkdir -p "$out/gen" "$out/obj"
sed -e 's/\${nccl:Major}/2/g; s/\${nccl:Minor}/0/g; s/\${nccl:Patch}/0/g; s/\${nccl:Suffix}//g' \
  -e 's/\${nccl:Version}/20000/g' "$nccl/src/nccl.h.in" >"$out/gen/nccl.h" || exit 2
inc=(-I "$out/gen" -I "$nccl/src/include" -I "$nccl/src/include/plugin" -I "$cuda_inc" -I "$cuda_inc/cccl"
  -I "$nccl/src")
units=(transport/net_ib.cc misc/ibvwrap.cc misc/ibvsymbols.cc misc/mlx5dvwrap.cc misc/mlx5dvsymbols.cc
  misc/socket.cc misc/utils.cc misc/param.cc debug.cc)
echo "nccl-ib-host: compiling NVIDIA's ${units[*]} (${ver:-version unknown}; about a minute)"
pids=()
for u in "${units[@]}"; do
  g++ -std=c++17 -O1 -w -c "${inc[@]}" "$nccl/src/$u" -o "$out/obj/$(basename "$u" .cc).o" \
    >"$out/obj/$(basename "$u" .cc).log" 2>&1 &
  pids+=($!)
done
ok=1
for p in "${pids[@]}"; do wait "$p" || ok=0; done
[ $ok = 1 ] || { echo "nccl-ib-host: NVIDIA's sources did not compile: see $out/obj/*.log" >&2; exit 2; }
sys=("${inc[@]}")
for i in "${!sys[@]}"; do [ "${sys[$i]}" = -I ] && sys[$i]=-isystem; done # NVIDIA's headers: no warnings
g++ -std=c++17 -O1 -Wall -Werror "${sys[@]}" "$root/ffi-tests/ibverbs/nccl_ib_host.cc" "$out"/obj/*.o \
  -o "$out/nccl_ib_host" -ldl -lpthread >"$out/link.log" 2>&1 ||
  { echo "nccl-ib-host: the driver did not build or link: see $out/link.log" >&2; cat "$out/link.log" >&2; exit 2; }
sv=$out/soft-verbs
mkdir -p "$sv"
gcc -shared -fPIC -O2 -Wall -Werror -fvisibility=hidden -Wl,-soname,libibverbs.so.1 \
  -Wl,--version-script="$root/ffi-tests/ibverbs/libibverbs.map" -o "$sv/libibverbs.so.1" \
  "$root/ffi-tests/ibverbs/soft_verbs.c" -lpthread || exit 2
ln -sf libibverbs.so.1 "$sv/libibverbs.so"
LD_LIBRARY_PATH="$sv" NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
  NCCL_DEBUG_FILE="$out/nccl.%p.log" timeout 120 "$out/nccl_ib_host"
rc=$?
grep -h -m1 'NET/IB : Using' "$out"/nccl.*.log 2>/dev/null | sed 's/^.*NCCL INFO /NVIDIA: /' | head -1
exit $rc
