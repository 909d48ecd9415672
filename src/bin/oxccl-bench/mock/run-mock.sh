#!/usr/bin/env bash
# Smoke test of oxccl-bench without a GPU: builds CPU stand-ins for libcuda.so.1 and
# libnccl.so.2 (mock_cuda.c, mock_nccl.c) and runs the bench on them with -g. Usage, from the
# repository root: src/bin/oxccl-bench/mock/run-mock.sh [path/to/oxccl-bench] [extra args...]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bench=${1:-target/debug/oxccl-bench}; [ $# -gt 0 ] && shift
dir=$(mktemp -d /tmp/oxccl-mock.XXXXXX)
cc -O1 -shared -fPIC -o "$dir/libcuda.so.1" "$here/mock_cuda.c"
ln -sf libcuda.so.1 "$dir/libcuda.so"
cc -O1 -shared -fPIC -o "$dir/libnccl.so.2" "$here/mock_nccl.c"
LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bench" --lib "$dir/libnccl.so.2" "$@"
