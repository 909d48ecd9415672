#!/usr/bin/env bash
# aws-ofi-nccl (the "Libfabric" NCCL net plugin) over libfabric's tcp provider, under oxccl and
# NVIDIA's NCCL: build it here, check it, and on a GPU machine count the WARN lines each
# library logs with it.
#
#   scripts/ofi-plugin.sh build     build .device/ofi from sources (no GPU needed)
#   scripts/ofi-plugin.sh check     dlopen the plugin, list its tables, resolve its libraries
#   scripts/ofi-plugin.sh run       GPU machine: oxccl-bench per library, 2 and 4 processes on
#                                   GPU 0, each its own host (NCCL_HOSTID); prints a table
#   scripts/ofi-plugin.sh selftest  run mode against a stand-in bench (no GPU): the table's
#                                   counting is checked
#
# Sources (build mode). With the `fetch` tool: github:aws/aws-ofi-nccl, github:ofiwg/libfabric
# and github:open-mpi/hwloc give bare git directories under /work/.mirror; then
#   git clone -q --no-checkout /work/.mirror/aws+aws-ofi-nccl/repo /tmp/ofi-src && git -C /tmp/ofi-src checkout -q v1.21.1
#   git clone -q --no-checkout /work/.mirror/ofiwg+libfabric/repo /tmp/fab-src && git -C /tmp/fab-src checkout -q v2.6.0
#   git clone -q --no-checkout /work/.mirror/open-mpi+hwloc/repo /tmp/hwloc-src && git -C /tmp/hwloc-src checkout -q hwloc-2.14.0
#   apt-get install -y autoconf automake libtool pkg-config
#   OFI_SRC=/tmp/ofi-src FABRIC_SRC=/tmp/fab-src HWLOC_SRC=/tmp/hwloc-src scripts/ofi-plugin.sh build
# (libfabric 2.6.0 is the release aws-ofi-nccl 1.21.1 was tested with.) Knobs: CUDA_HOME (has
# include/cuda.h and lib/ or lib64/libcudart_static.a; default .toolchain/py/nvidia/cu13),
# BUILD_DIR (default /tmp/ofi-build), DEST (default .device/ofi), JOBS (default 2).
#
# What build makes (about 3 MB, nothing else needed at run time but glibc >= 2.34, libstdc++
# and libgcc_s): libfabric (tcp and rxm providers only, no CUDA: buffers are in host memory)
# and hwloc (no libudev, libxml2 or plugins) are linked statically into
# DEST/libnccl-net-ofi.so, which exports only its ncclNetPlugin_v6..v12, ncclGinPlugin_* and
# ncclRmaPlugin_* tables (the CUDA runtime is linked statically too, aws-ofi-nccl's default);
# DEST/fi_info (libfabric's provider listing, static), DEST/ofi-dlcheck (dlopen check, see
# check) and DEST/BUILD-INFO.txt (sources and versions).
#
# Run mode, from the repository root on the GPU machine (no build there). Carry .device/ofi,
# .device/bin/oxccl-bench, .device/lib/libnccl.so.2 and .device/ref/libnccl-2.32.3.so.2.xz.
# Libraries: oxccl (.device/lib/libnccl.so.2), NVIDIA 2.28.9 (PyTorch's, NV_LIB), NVIDIA 2.32.3
# (.device/ref/lib/libnccl.so.2, unpacked from the .xz when missing); one that is absent is
# skipped with a line saying so. OFI_LIBS="label=path ..." replaces the list. Per library: one
# INFO run (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET, all_reduce 8 B, 2 processes) proves
# the plugin was used ("Loaded net plugin Libfabric" and "Using network Libfabric"), then for
# each of OFI_RANKS (default "2 4") processes a WARN run (NCCL_DEBUG=WARN) of
#   all_reduce, all_gather, sendrecv; float sum; out of place; checked; 8 B .. 16 MiB+4
# Environment of every run (OFI_ENV): FI_PROVIDER=tcp FI_TCP_IFACE=lo NCCL_SOCKET_IFNAME=lo
# OFI_NCCL_EXCLUDE_TCP_IF=docker0. The last one matters: aws-ofi-nccl drops every tcp
# provider whose domain (interface) is in OFI_NCCL_EXCLUDE_TCP_IF, "lo,docker0" by default, so
# on lo alone both its protocols find no provider ("No eligible providers were found",
# "Unable to find a protocol that worked"). With lo allowed it selects "tcp;ofi_rxm" on lo
# (IPv4; the plain tcp RDM entry has address format FI_SOCKADDR_IP, which it drops) with its
# sendrecv protocol and host buffers: its FI_HMEM hints find nothing in a libfabric built
# without CUDA, so it reports no GPU Direct and sets NCCL_PROTO=simple itself. Its rdma
# protocol needs FI_HMEM and is not available here (an INFO line, not a WARN). It reports 3
# devices, all lo: libfabric lists tcp;ofi_rxm on lo (IPv4) three times.
# Every run is under `timeout` (OFI_TIMEOUT s, default 45; oxccl-bench --timeout
# OFI_STEP_TIMEOUT, default 30). Output: the table on stdout and in $OUT/ofi-table.txt, every
# log in $OUT/ofi-logs.tgz (OUT default /tmp/ofi-run). Exit status: 0 when every run exited 0
# with no wrong element and the plugin was used by every library; 1 otherwise; 3 when it could
# not start (no GPU, no plugin, no bench: it says which). WARN counts are measurements, not
# failures.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
DEST=${DEST:-$root/.device/ofi}
NV_LIB=${NV_LIB:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2}
OFI_NET=${OFI_NET:-Libfabric}
# The libfabric and aws-ofi-nccl environment of run mode (see the header).
OFI_ENV=(FI_PROVIDER=tcp FI_TCP_IFACE=lo NCCL_SOCKET_IFNAME=lo OFI_NCCL_EXCLUDE_TCP_IF=docker0)

die() {
  echo "ofi-plugin: $*" >&2
  exit 3
}

# ---------------------------------------------------------------------------------------------
# build

# The dlopen checker: ofi-dlcheck PLUGIN [init]. Lists the ncclNetPlugin_vN tables and their
# names; exit 0 when a v8..v11 table exists. With "init", calls ncclNetPlugin_v8's init (with
# a logger printing to stderr) and devices(): exit 0 only when both succeed and there is a
# device (needs a CUDA driver: aws-ofi-nccl's init resolves CUDA driver functions).
dlcheck_source() {
  cat <<'EOF'
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef void (*logger_t)(int level, unsigned long flags, const char *file, int line,
                         const char *fmt, ...);
/* The first three members of ncclNet_v8_t. */
struct net_v8_head {
  const char *name;
  int (*init)(logger_t log);
  int (*devices)(int *ndev);
};

static void logger(int level, unsigned long flags, const char *file, int line,
                   const char *fmt, ...) {
  va_list ap;
  (void)flags;
  fprintf(stderr, "plugin log [%d] %s:%d: ", level, file ? file : "?", line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PLUGIN.so [init]\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("dlopen FAILED: %s\n", dlerror());
    return 1;
  }
  int supported = 0;
  for (int v = 12; v >= 6; v--) {
    char sym[32];
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
    const char **table = dlsym(lib, sym);
    if (!table) continue;
    printf("%s name=\"%s\"\n", sym, *table ? *table : "(null)");
    if (v >= 8 && v <= 11) supported = 1;
  }
  if (!supported) {
    printf("no ncclNetPlugin_v8..v11 table\n");
    return 1;
  }
  if (argc > 2 && strcmp(argv[2], "init") == 0) {
    struct net_v8_head *v8 = dlsym(lib, "ncclNetPlugin_v8");
    if (!v8) {
      printf("init: no ncclNetPlugin_v8 table\n");
      return 1;
    }
    int rc = v8->init(logger);
    printf("init (v8) returned %d\n", rc);
    fflush(stdout);
    if (rc != 0) return 1;
    int n = -1;
    rc = v8->devices(&n);
    printf("devices returned %d, %d device(s)\n", rc, n);
    if (rc != 0 || n < 1) return 1;
  }
  return 0;
}
EOF
}

# step NAME SECONDS CMD...: run one build step with its output in $BUILD_DIR/NAME.log; on
# failure print the log's tail and stop.
step() {
  local name=$1 limit=$2
  shift 2
  echo "ofi-plugin: $name"
  if ! timeout -k 10 "$limit" "$@" >"$BUILD_DIR/$name.log" 2>&1; then
    tail -30 "$BUILD_DIR/$name.log" >&2
    die "build step '$name' failed (log: $BUILD_DIR/$name.log)"
  fi
}

build() {
  local need tool
  : "${OFI_SRC:?set OFI_SRC to an aws-ofi-nccl checkout (see the header of this script)}"
  : "${FABRIC_SRC:?set FABRIC_SRC to a libfabric checkout}"
  : "${HWLOC_SRC:?set HWLOC_SRC to an hwloc checkout}"
  OFI_SRC=$(cd "$OFI_SRC" && pwd) FABRIC_SRC=$(cd "$FABRIC_SRC" && pwd)
  HWLOC_SRC=$(cd "$HWLOC_SRC" && pwd)
  BUILD_DIR=${BUILD_DIR:-/tmp/ofi-build}
  CUDA_HOME=${CUDA_HOME:-$root/.toolchain/py/nvidia/cu13}
  JOBS=${JOBS:-2}
  need=""
  for tool in autoreconf automake libtoolize pkg-config gcc g++ make strip nm; do
    command -v "$tool" >/dev/null || need="$need $tool"
  done
  [ -z "$need" ] || die "missing tools:$need (apt-get install -y autoconf automake libtool pkg-config g++ make binutils)"
  [ -f "$CUDA_HOME/include/cuda.h" ] || die "no $CUDA_HOME/include/cuda.h (set CUDA_HOME)"
  local cudalib=""
  for d in lib64 lib; do
    [ -f "$CUDA_HOME/$d/libcudart_static.a" ] && cudalib=$CUDA_HOME/$d && break
  done
  [ -n "$cudalib" ] || die "no libcudart_static.a under $CUDA_HOME/lib64 or lib"
  mkdir -p "$BUILD_DIR" || die "cannot make $BUILD_DIR"
  BUILD_DIR=$(cd "$BUILD_DIR" && pwd)

  # aws-ofi-nccl's configure wants --with-cuda=DIR with DIR/include and DIR/lib64.
  local cuda=$BUILD_DIR/cuda
  mkdir -p "$cuda"
  ln -sfn "$CUDA_HOME/include" "$cuda/include"
  ln -sfn "$cudalib" "$cuda/lib64"

  # libfabric, static. --enable-embedded turns its symbol versioning off (versioned symbols
  # in a static archive cannot be linked into another shared library) and builds the library
  # as a convenience archive, which is copied out by hand.
  local fab=$BUILD_DIR/fabric-install
  [ -x "$FABRIC_SRC/configure" ] || step fabric-autogen 600 sh -c "cd '$FABRIC_SRC' && ./autogen.sh"
  rm -rf "$BUILD_DIR/fabric" "$fab" && mkdir -p "$BUILD_DIR/fabric" "$fab/lib"
  step fabric-configure 600 sh -c "cd '$BUILD_DIR/fabric' && '$FABRIC_SRC/configure' \
    --prefix='$fab' --enable-only --enable-tcp=yes --enable-rxm=yes --enable-static \
    --disable-shared --enable-embedded --with-pic --disable-debug --with-cuda=no \
    --with-uring=no --without-lttng"
  step fabric-make 1800 make -C "$BUILD_DIR/fabric" -j"$JOBS" install
  cp "$BUILD_DIR/fabric/src/.libs/libfabric.a" "$fab/lib/" || die "no libfabric.a built"
  grep -q "Built-in providers:.*tcp" "$BUILD_DIR/fabric-configure.log" ||
    die "libfabric was configured without the tcp provider (see $BUILD_DIR/fabric-configure.log)"

  # hwloc, static, Linux PCI discovery from sysfs (aws-ofi-nccl walks the PCI tree).
  local hw=$BUILD_DIR/hwloc-install
  [ -x "$HWLOC_SRC/configure" ] || step hwloc-autogen 600 sh -c "cd '$HWLOC_SRC' && ./autogen.sh"
  rm -rf "$BUILD_DIR/hwloc" "$hw" && mkdir -p "$BUILD_DIR/hwloc"
  step hwloc-configure 600 sh -c "cd '$BUILD_DIR/hwloc' && '$HWLOC_SRC/configure' \
    --prefix='$hw' --enable-static --disable-shared --with-pic --disable-libudev \
    --disable-libxml2 --disable-cairo --disable-opencl --disable-cuda --disable-nvml \
    --disable-rsmi --disable-levelzero --disable-gl --disable-plugins --disable-doxygen \
    --disable-readme --disable-picky"
  step hwloc-make 1800 make -C "$BUILD_DIR/hwloc" -j"$JOBS" install

  # aws-ofi-nccl: its build makes libinternal_plugin.a (every object of the plugin); the
  # shared library is linked from it below rather than by libtool, so that only the plugin
  # tables are exported (libtool's link would also export every libfabric and hwloc symbol).
  [ -x "$OFI_SRC/configure" ] || step ofi-autogen 600 sh -c "cd '$OFI_SRC' && ./autogen.sh"
  rm -rf "$BUILD_DIR/ofi" && mkdir -p "$BUILD_DIR/ofi"
  step ofi-configure 600 sh -c "cd '$BUILD_DIR/ofi' && '$OFI_SRC/configure' \
    --prefix='$BUILD_DIR/ofi-install' --with-libfabric='$fab' --with-hwloc='$hw' \
    --with-cuda='$cuda' --disable-platform-aws --disable-tests --enable-shared --disable-static"
  step ofi-make 3600 make -C "$BUILD_DIR/ofi" -j"$JOBS"
  local internal=$BUILD_DIR/ofi/src/.libs/libinternal_plugin.a
  [ -f "$internal" ] || die "no $internal after make"

  printf '{\n  global: ncclNetPlugin_v*; ncclGinPlugin_v*; ncclRmaPlugin_v*;\n  local: *;\n};\n' \
    >"$BUILD_DIR/exports.map"
  local so=$BUILD_DIR/libnccl-net-ofi.so
  step ofi-link 600 g++ -shared -o "$so" -Wl,-soname,libnccl-net-ofi.so \
    -Wl,--whole-archive "$internal" -Wl,--no-whole-archive \
    "$hw/lib/libhwloc.a" "$fab/lib/libfabric.a" -L"$cuda/lib64" -lcudart_static \
    -lrt -ldl -lm -pthread -Wl,--version-script="$BUILD_DIR/exports.map" -Wl,-z,defs
  dlcheck_source >"$BUILD_DIR/ofi-dlcheck.c"
  step dlcheck-cc 120 gcc -O1 -Wall -Wextra -Werror -o "$BUILD_DIR/ofi-dlcheck" \
    "$BUILD_DIR/ofi-dlcheck.c" -ldl

  rm -rf "$DEST"
  mkdir -p "$DEST" || die "cannot make $DEST"
  strip --strip-unneeded -o "$DEST/libnccl-net-ofi.so" "$so"
  strip -o "$DEST/fi_info" "$fab/bin/fi_info"
  strip -o "$DEST/ofi-dlcheck" "$BUILD_DIR/ofi-dlcheck"
  {
    echo "aws-ofi-nccl $(git -C "$OFI_SRC" describe --tags 2>/dev/null) $(git -C "$OFI_SRC" rev-parse HEAD 2>/dev/null)"
    echo "libfabric $(git -C "$FABRIC_SRC" describe --tags 2>/dev/null) $(git -C "$FABRIC_SRC" rev-parse HEAD 2>/dev/null) (static; providers: tcp rxm; no CUDA)"
    echo "hwloc $(git -C "$HWLOC_SRC" describe --tags 2>/dev/null) $(git -C "$HWLOC_SRC" rev-parse HEAD 2>/dev/null) (static)"
    echo "cuda runtime (static) from $CUDA_HOME"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"'), $(ldd --version | head -1)"
  } >"$DEST/BUILD-INFO.txt"
  du -sh "$DEST"
  check
}

# ---------------------------------------------------------------------------------------------
# check

check() {
  local so=$DEST/libnccl-net-ofi.so fail=0 v glibc
  [ -f "$so" ] || die "no plugin at $so (run: scripts/ofi-plugin.sh build)"
  echo "ofi-plugin: checking $so"
  for v in 8 9 10 11; do
    nm -D --defined-only "$so" | grep -q " ncclNetPlugin_v$v\$" ||
      { echo "FAIL: ncclNetPlugin_v$v not exported"; fail=1; }
  done
  if LD_LIBRARY_PATH=$DEST${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd -r "$so" 2>&1 |
    grep -E "not found|undefined symbol"; then
    echo "FAIL: unresolved libraries or symbols (above)"
    fail=1
  fi
  glibc=$(objdump -T "$so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  echo "needs: $(ldd "$so" | awk '/=>/ {print $1}' | tr '\n' ' ')(newest symbol version $glibc)"
  if ! timeout 30 "$DEST/ofi-dlcheck" "$so"; then
    echo "FAIL: the plugin did not load (dlopen)"
    fail=1
  fi
  # The provider the plugin selects in run mode (no GPU needed): tagged RDM over tcp;ofi_rxm
  # on lo, IPv4. fi_info has the same static libfabric as the plugin.
  local offered
  offered=$(env "${OFI_ENV[@]}" timeout 20 "$DEST/fi_info" -t FI_EP_RDM -c 'FI_TAGGED|FI_MSG' \
    -a FI_SOCKADDR_IN -d lo 2>&1)
  if grep -q "^provider: tcp;ofi_rxm" <<<"$offered"; then
    echo "libfabric offers: tcp;ofi_rxm, FI_EP_RDM, FI_TAGGED, domain lo, FI_SOCKADDR_IN (${OFI_ENV[*]})"
  else
    echo "FAIL: libfabric offers no tcp;ofi_rxm RDM endpoint on lo: $(head -c 200 <<<"$offered")"
    fail=1
  fi
  echo "exported: $(nm -D --defined-only "$so" | awk '{print $3}' | tr '\n' ' ')"
  if [ $fail = 0 ]; then echo "check: OK"; else echo "check: FAILED"; fi
  return $fail
}

# ---------------------------------------------------------------------------------------------
# run

# summarize LOG: prints "WARNS<TAB>top1<TAB>top2<TAB>top3", each top entry "COUNT x MESSAGE"
# (the text after "NCCL WARN", hexadecimal and decimal numbers replaced by #).
summarize() {
  local log=$1 total
  total=$(grep -c "NCCL WARN" "$log")
  printf '%s' "$total"
  grep "NCCL WARN" "$log" | sed -e 's/.*NCCL WARN *//' -e 's/0x[0-9a-fA-F][0-9a-fA-F]*/@HEX@/g' \
    -e 's/[0-9][0-9]*/#/g' -e 's/@HEX@/0x#/g' | sort | uniq -c | sort -rn | head -3 |
    while read -r count msg; do printf '\t%s x %s' "$count" "${msg:0:110}"; done
  printf '\n'
}

# why LOG: the lines of a failed run that say why (the bench's errors, hangs and refusals,
# the libraries' WARN lines about the network or plugin), at most 3.
why() {
  grep -E "oxccl-bench: .*(error|HANG|REFUSED)|NCCL WARN .*(NET|[Pp]lugin|OFI)|killed by timeout" "$1" |
    head -3 | cut -c1-160 | sed 's/^/      why: /'
}

# bench_run LOG ENV... -- BENCH_ARGS...: one oxccl-bench run under timeout; its exit status.
bench_run() {
  local log=$1 rc
  shift
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  {
    echo "# $(date -u +%H:%M:%S) env: NCCL_NET_PLUGIN=$DEST/libnccl-net-ofi.so NCCL_NET=$OFI_NET ${OFI_ENV[*]} ${envs[*]}"
    echo "# command: $BENCH $*"
  } >"$log"
  env NCCL_NET_PLUGIN="$DEST/libnccl-net-ofi.so" NCCL_NET="$OFI_NET" "${OFI_ENV[@]}" "${envs[@]}" \
    timeout -k 10 "$TIMEOUT" "$BENCH" "$@" >>"$log" 2>&1 </dev/null
  rc=$?
  echo "# exit status $rc$( [ $rc = 124 ] || [ $rc = 137 ] && echo " (killed by timeout after ${TIMEOUT}s)")" >>"$log"
  return $rc
}

run() {
  local out=${OUT:-/tmp/ofi-run} logs
  BENCH=${OFI_BENCH:-$root/.device/bin/oxccl-bench}
  TIMEOUT=${OFI_TIMEOUT:-45}
  local step_timeout=${OFI_STEP_TIMEOUT:-30} ranks=${OFI_RANKS:-"2 4"}
  local so=$DEST/libnccl-net-ofi.so
  mkdir -p "$out" || die "cannot make $out"
  out=$(cd "$out" && pwd)
  logs=$out/logs
  rm -rf "$logs" && mkdir -p "$logs"

  [ -x "$BENCH" ] || die "no oxccl-bench at $BENCH (carry .device/bin/oxccl-bench or set OFI_BENCH)"
  [ -f "$so" ] || die "no plugin at $so (carry .device/ofi, built by: scripts/ofi-plugin.sh build)"
  if [ "${OFI_SKIP_GPU_CHECK:-0}" != 1 ]; then
    command -v nvidia-smi >/dev/null || die "no GPU: nvidia-smi is not installed; not run"
    timeout 30 nvidia-smi -L >"$logs/nvidia-smi.txt" 2>&1
    grep -q "^GPU " "$logs/nvidia-smi.txt" ||
      die "no GPU: nvidia-smi -L lists none ($(head -c 200 "$logs/nvidia-smi.txt")); not run"
  fi

  # The plugin on its own: dlopen, tables, and (with the GPU's driver) init and devices.
  local dlcheck=$DEST/ofi-dlcheck plugin_ok=1
  if [ -x "$dlcheck" ]; then
    if ! timeout 30 "$dlcheck" "$so" >"$logs/dlcheck.txt" 2>&1; then
      cat "$logs/dlcheck.txt"
      echo "ofi-plugin: the plugin did not load (dlopen failed or no v8..v11 table); runs go on to show what the libraries do"
      plugin_ok=0
    fi
    if [ "${OFI_SKIP_GPU_CHECK:-0}" != 1 ]; then
      env "${OFI_ENV[@]}" timeout -k 5 60 "$dlcheck" "$so" init >"$logs/dlcheck-init.txt" 2>&1 ||
        echo "ofi-plugin: the plugin's own init/devices failed outside NCCL: $(grep -E 'init|devices|WARN|\[2\]' "$logs/dlcheck-init.txt" | tail -3 | tr '\n' ' ')"
    fi
  else
    echo "ofi-plugin: no $dlcheck; dlopen check skipped"
  fi
  [ -x "$DEST/fi_info" ] && env "${OFI_ENV[@]}" timeout 20 "$DEST/fi_info" -t FI_EP_RDM >"$logs/fi_info.txt" 2>&1

  # The libraries.
  local libs=${OFI_LIBS:-}
  if [ -z "$libs" ]; then
    local ref=$root/.device/ref/lib/libnccl.so.2 xz=$root/.device/ref/libnccl-2.32.3.so.2.xz
    if [ ! -f "$ref" ] && [ -f "$xz" ]; then
      if ! { mkdir -p "$(dirname "$ref")" && timeout 120 xz -dc -T0 "$xz" >"$ref.tmp" &&
        mv "$ref.tmp" "$ref"; }; then
        rm -f "$ref.tmp"
        echo "ofi-plugin: could not unpack $xz"
      fi
    fi
    libs="oxccl=$root/.device/lib/libnccl.so.2 nccl-2.28.9=$NV_LIB nccl-2.32.3=$ref"
  fi

  local common=(-c "all_reduce,all_gather,sendrecv" -d float -o sum --inplace 0 --check 1 -w 1 -n 3
    --sizes "8,65540,1048580,16777220" --hostid-per-rank --timeout "$step_timeout")
  local table=$out/ofi-table.txt entry label lib n rc wrong rows used version status=0
  local sizes_rows=12
  {
    printf '# aws-ofi-nccl over libfabric tcp, NCCL_NET=%s, one GPU, every rank its own host\n' "$OFI_NET"
    printf '# plugin: %s\n' "$(head -2 "$DEST/BUILD-INFO.txt" 2>/dev/null | cut -d' ' -f1,2 | tr '\n' ' ')"
    printf '# %-12s %-5s %-6s %-6s %-6s %-6s %s\n' library ranks exit rows wrong WARN "plugin used (INFO run)"
  } >"$table"
  for entry in $libs; do
    label=${entry%%=*} lib=${entry#*=}
    if [ ! -f "$lib" ]; then
      echo "  $label: SKIPPED, no library at $lib" >>"$table"
      continue
    fi
    # INFO run: was the plugin loaded and its network used?
    local info=$logs/$label-info.log
    bench_run "$info" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET -- --lib "$lib" \
      -c all_reduce -d float -o sum --inplace 0 --check 1 -w 0 -n 1 --sizes 8 \
      -p 2 --ranks-per-gpu 2 --hostid-per-rank --timeout "$step_timeout"
    rc=$?
    version=$(grep -o -m1 "NCCL version [^ ]*" "$info" | cut -d' ' -f3)
    if grep -q "Loaded net plugin $OFI_NET" "$info" && grep -q "Using network $OFI_NET" "$info"; then
      used="yes (v${version:-?}; $(grep -o -m1 "Loaded net plugin $OFI_NET ([^)]*)" "$info"))"
    else
      used="NO: the plugin was not used (exit $rc; see $label-info.log)"
      status=1
      echo "  $label: the plugin was NOT used; from $label-info.log:" >>"$table"
      why "$info" >>"$table"
    fi
    for n in $ranks; do
      local log=$logs/$label-p$n.log json=$logs/$label-p$n.json
      bench_run "$log" NCCL_DEBUG=WARN -- --lib "$lib" "${common[@]}" -p "$n" \
        --ranks-per-gpu "$n" --json "$json"
      rc=$?
      wrong=$(sed -n 's/^# Wrong elements in total: \([0-9]*\).*/\1/p' "$log" | tail -1)
      rows=0
      [ -f "$json" ] && rows=$(grep -c '"wrong":' "$json")
      [ "$rc" = 0 ] && [ "${wrong:-x}" = 0 ] && [ "$rows" = "$sizes_rows" ] || status=1
      local sum
      sum=$(summarize "$log")
      printf '  %-12s %-5s %-6s %-6s %-6s %-6s %s\n' "$label" "$n" "$rc" "$rows/$sizes_rows" \
        "${wrong:--}" "${sum%%$'\t'*}" "$used" >>"$table"
      [[ $sum == *$'\t'* ]] && printf '%s\n' "${sum#*$'\t'}" | tr '\t' '\n' |
        sed 's/^/      /' >>"$table"
      if [ "$rc" != 0 ]; then
        why "$log" >>"$table"
      fi
    done
  done
  if [ "$plugin_ok" = 0 ]; then
    echo "# the plugin did not dlopen on its own (dlcheck.txt)" >>"$table"
    status=1
  fi
  cat "$table"
  cp "$table" "$logs/"
  tar -C "$out" -czf "$out/ofi-logs.tgz" logs && rm -rf "$logs"
  echo "ofi-plugin: logs in $out/ofi-logs.tgz; status $status"
  return $status
}

# ---------------------------------------------------------------------------------------------
# selftest: run mode with a stand-in oxccl-bench (a shell script printing what the real one
# and the libraries print), no GPU. Checks the table's exit, rows, wrong, WARN and top-message
# columns, the plugin-used column and the overall status.
selftest() {
  local fake
  selftest_dir=$(mktemp -d /tmp/ofi-selftest.XXXXXX) || die "mktemp failed"
  trap 'rm -rf "$selftest_dir"' EXIT
  local dir=$selftest_dir
  fake=$dir/bench
  cat >"$fake" <<'EOF'
#!/usr/bin/env bash
# Stand-in oxccl-bench: library "good" loads the plugin and logs 2 WARN lines per run (its
# network is used only when OFI_NCCL_EXCLUDE_TCP_IF allows lo, as aws-ofi-nccl's is); "bad"
# does not use the plugin, and its 4-process run gets 3 wrong elements and exit status 1;
# "slow" hangs (with a child process, which the timeout must end too).
lib="" json="" p=0 info=0
while [ $# -gt 0 ]; do
  case $1 in --lib) lib=$2; shift ;; --json) json=$2; shift ;; -p) p=$2; shift ;; esac
  shift
done
[ "${NCCL_DEBUG:-}" = INFO ] && info=1
name=$(basename "$(dirname "$lib")")
if [ "$name" = slow ]; then
  sleep 60 &
  sleep 61
fi
if [ $info = 1 ]; then
  echo "h:1:1 [0] NCCL INFO NCCL version 9.9.9+fake"
  if [ "$name" = good ]; then
    echo "h:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v11)"
    if [[ ,${OFI_NCCL_EXCLUDE_TCP_IF-lo,docker0}, == *,lo,* ]]; then
      echo "h:1:1 [0] NCCL INFO NET/OFI No eligible providers were found"
    else
      echo "h:1:1 [0] NCCL INFO Using network Libfabric"
    fi
  fi
  exit 0
fi
wrong=0
[ "$name" = bad ] && [ "$p" = 4 ] && wrong=3
: >"$json"
for i in $(seq 12); do echo "{\"wrong\":$((i == 1 ? wrong : 0))}" >>"$json"; done
if [ "$name" = good ]; then
  echo "h:1:2 [0] NCCL WARN NET/OFI Requests freelist: there are 8 in-use entries that are not released"
  echo "h:1:3 [1] NCCL WARN NET/OFI Closing recv_comm 0x55aa12 with inflight requests"
fi
echo "# Wrong elements in total: $wrong  => $([ $wrong = 0 ] && echo OK || echo FAILED)"
[ $wrong = 0 ]
EOF
  chmod +x "$fake"
  mkdir -p "$dir/good" "$dir/bad" "$dir/slow" "$dir/plugin"
  : >"$dir/good/libnccl.so.2"
  : >"$dir/bad/libnccl.so.2"
  : >"$dir/slow/libnccl.so.2"
  local so=$DEST/libnccl-net-ofi.so
  [ -f "$so" ] || so=/bin/true
  cp "$so" "$dir/plugin/libnccl-net-ofi.so"
  local got rc
  got=$(DEST=$dir/plugin OUT=$dir/out OFI_BENCH=$fake OFI_SKIP_GPU_CHECK=1 OFI_TIMEOUT=2 \
    OFI_LIBS="good=$dir/good/libnccl.so.2 bad=$dir/bad/libnccl.so.2 slow=$dir/slow/libnccl.so.2 gone=$dir/none/libnccl.so.2" \
    "$0" run 2>&1)
  rc=$?
  echo "$got"
  local fail=0
  expect() {
    grep -qE "$1" <<<"$got" || { echo "selftest FAIL: no line matching: $1"; fail=1; }
  }
  expect '^  good +2 +0 +12/12 +0 +2 +yes \(v9\.9\.9\+fake; Loaded net plugin Libfabric \(v11\)\)'
  expect '^  good +4 +0 +12/12 +0 +2 '
  expect '^      1 x NET/OFI Closing recv_comm 0x# with inflight requests$'
  expect '^      1 x NET/OFI Requests freelist: there are # in-use entries that are not released$'
  expect '^  bad +2 +0 +12/12 +0 +0 +NO: the plugin was not used'
  expect '^  bad +4 +1 +12/12 +3 +0 '
  expect '^  gone: SKIPPED, no library at '
  expect '^  slow +4 +124 +0/12 +- +0 +NO: the plugin was not used \(exit 124;'
  expect '^      why: # exit status 124 \(killed by timeout after 2s\)$'
  if pgrep -f "sleep 6[01]" >/dev/null; then
    echo "selftest FAIL: the hanging stand-in left processes behind"
    fail=1
  fi
  [ "$rc" = 1 ] || { echo "selftest FAIL: run's status $rc, expected 1"; fail=1; }
  if ! tar -tzf "$dir/out/ofi-logs.tgz" 2>/dev/null | grep -q 'logs/good-p4.log'; then
    echo "selftest FAIL: no good-p4.log in ofi-logs.tgz"
    fail=1
  fi
  if [ $fail = 0 ]; then echo "selftest: OK"; else echo "selftest: FAILED"; fi
  return $fail
}

case ${1:-} in
  build) build ;;
  check) check ;;
  run) run ;;
  selftest) selftest ;;
  *)
    echo "usage: scripts/ofi-plugin.sh build|check|run|selftest (see the header)" >&2
    exit 2
    ;;
esac
