#!/usr/bin/env bash
# Smoke test of oxccl-bench without a GPU: builds CPU stand-ins for libcuda.so.1 and
# libnccl.so.2 (mock_cuda.c, mock_nccl.c) and runs the bench on them (-g with any number of
# ranks and any placement, e.g. --devices 0,0; -p runs collectives only with -p 1, but init of
# -p N works, enough to test refusals). Usage, from the repository root:
#   src/bin/oxccl-bench/mock/run-mock.sh [path/to/oxccl-bench] [extra args...]
# An extra argument @mock is replaced by the mock library's path (e.g. --vs @mock), and
# @nvidia-like by the path of a second copy of the mock that, like NVIDIA's 2.28, refuses
# ranks sharing a GPU (e.g. --vs @nvidia-like --devices 0,0).
# Knobs (environment): MOCK_GPUS, MOCK_BREAK, MOCK_HANG, MOCK_REFUSE_SHARED, MOCK_REFUSE_RANK,
# MOCK_INIT_HANG, MOCK_COLL_US; see the two C files. The bench's exit status is the script's.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bench=${1:-target/debug/oxccl-bench}; [ $# -gt 0 ] && shift
dir=$(mktemp -d /tmp/oxccl-mock.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cc -O1 -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so.1" "$here/mock_cuda.c"
ln -sf libcuda.so.1 "$dir/libcuda.so"
cc -O1 -shared -fPIC -o "$dir/libnccl.so.2" "$here/mock_nccl.c" -ldl
mkdir "$dir/nvidia-like"
cc -O1 -shared -fPIC -DMOCK_REFUSES_SHARED -o "$dir/nvidia-like/libnccl.so.2" "$here/mock_nccl.c" -ldl
args=()
for arg in "$@"; do
  case $arg in
    @mock) args+=("$dir/libnccl.so.2") ;;
    @nvidia-like) args+=("$dir/nvidia-like/libnccl.so.2") ;;
    *) args+=("$arg") ;;
  esac
done
export MOCK_DIR="$dir"
status=0
LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bench" --lib "$dir/libnccl.so.2" ${args[@]+"${args[@]}"} || status=$?
exit $status
