#!/usr/bin/env bash
# Small collectives timed by NVIDIA's own benchmark, nccl-tests, with oxccl and NVIDIA's NCCL in
# one run: per collective, a table of the out-of-place time per operation (µs) at each size, one
# column per library, and the ratio oxccl / fastest NVIDIA library.
#
# usage: scripts/nccl-tests.sh source | build | run | selftest
#
# build (this machine): compiles nccl-tests into $DEST/nccl-tests.tar.xz (the nine *_perf
#   binaries that run uses, stripped: about 44 MB, 0.9 MB compressed, so that a device call can
#   carry them) and $DEST/BUILD-INFO. SRC=<nccl-tests checkout> is required; to get one:
#     git clone https://github.com/NVIDIA/nccl-tests /tmp/nccl-tests
#       (with no internet: the fetch tool's mirror, git clone /work/.mirror/NVIDIA+nccl-tests/repo ...)
#     git -C /tmp/nccl-tests checkout v2.19.6      (the newest release tag; git tag --sort=-v:refname)
#     SRC=/tmp/nccl-tests scripts/nccl-tests.sh build
#   Compiled with MPI=0 for sm_90 only, cudart linked statically, against include/nccl.h plus
#   NVIDIA's device-API headers (nccl_device.h and nccl_device/, which nccl-tests includes for
#   NCCL >= 2.28; our include/ has only nccl.h), and linked to libnccl.so.2 by name: at run time
#   the binaries need libnccl.so.2 (through LD_LIBRARY_PATH), libstdc++, libgcc_s, libm and libc,
#   nothing of CUDA but the driver. Takes about 4 minutes on 2 cores.
#   With NT_MPI_HOME (an MPI installation: include/mpi.h, lib/ or lib64/libmpi.so; "auto": the
#   one mpicc names) the binaries are built with MPI=1 and also need libmpi: that is the build
#   for NT_NPROCS > 1 below, made on the GPU machine, which has nvcc and Open MPI (the source
#   mode packs what it needs). NT_BUILD_BINS (default: all nine) picks the binaries.
#   env: DEST (.device/nccl-tests), CUDA_HOME (.toolchain/py/nvidia/cu13: bin/nvcc, include/,
#   lib/ or lib64/libcudart_static.a), NCCL_LIB (a libnccl.so with the 2.32.3 ABI to link against; default
#   target/release/libnccl.so, else .device/lib/libnccl.so.2), NCCL_DEVICE_INC (a folder with
#   NVIDIA 2.32.3's nccl_device.h; default .toolchain/nccl-2.32.3/nvidia/nccl/include), JOBS (2).
#
# source (this machine): packs SRC (a nccl-tests checkout, without .git) and NCCL_DEVICE_INC
#   into $DEST/nccl-tests-src.tar.gz (about 0.2 MB: nccl-tests/ and nccl-device-include/), for
#   building with MPI where MPI is.
#
# run (the GPU machine, from the repository root; carry .device/lib, .device/ref and
#   .device/nccl-tests): for each collective, each library in turn runs
#     <collective>_perf -g 1 -b 8 -e 8M -f 4 -w 5 -n 20 -c 1 -d float
#   (8 B, 32 B, ... 512 KiB, 2 MiB, 8 MiB; -f 8 from 8 B would stop at 2 MiB and miss 512 KiB)
#   with LD_LIBRARY_PATH = a folder holding only that library as libnccl.so.2, NCCL_NVLS_ENABLE=0
#   and LD_BIND_NOW unset (the binaries name ncclCommQueryProperties, which 2.28 lacks and which
#   only the device-API paths call), each under `timeout`. The table takes the out-of-place time
#   (nccl-tests prints in place too). The first library is the one the ratio is about; the ratio
#   is its time over the fastest of the others at that size. Then one summary line per
#   collective: the worst ratio at sizes up to 8 MiB and the median ratio (sizes above 0 B).
#   Last, each run's mean time over the sizes up to 128 KiB per collective and library (which
#   of a machine's per-process levels each run landed on), and the first library's best run
#   over the best run of any other.
#   Each run is checked before its numbers count: the dynamic loader's log (LD_DEBUG=libs) must
#   show that it initialised the library from that folder, nccl-tests must have printed the
#   version the library reports (nccl-library=), the run must have ended with status 0 and no
#   wrong elements, and the first library must be oxccl and the others not (the file holds the
#   text "+oxccl" or not). A run that fails a check shows n/a and the reason; a library that
#   is missing is a SKIPPED line. The version shown is the one the library writes to its log
#   (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT, into a file of its own: NVIDIA's at init,
#   "2.28.9+cuda13.0"; oxccl's with its first INFO line, "2.32.3+oxccl"), else the one
#   ncclGetVersion reports, "+oxccl" added for oxccl.
#   Libraries (label=path, first is compared; a path need not be named libnccl.so.2):
#     NT_LIBS (default "ours=.device/lib/libnccl.so.2
#       nv2289=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
#       nv2323=.device/ref/lib/libnccl.so.2"); the last is unpacked from
#       .device/ref/libnccl-2.32.3.so.2.xz when that is newer or it is missing.
#   env: NT_COLLS (all_reduce all_gather reduce_scatter broadcast reduce alltoall gather scatter
#   sendrecv), NT_ARGS (the arguments after -g 1, as above), NT_BIN (a folder with the *_perf
#   binaries; default: .device/nccl-tests/nccl-tests.tar.xz unpacked into a temporary folder),
#   NT_CPUS (the CPUs every run is pinned to; default two CPUs of GPU 0's NUMA node other than
#   CPU 0, from scripts/gpu-cpus; none: not pinned), NT_REPEAT (3: runs of each library, taking turns;
#   each size's time is the median of its runs), NT_BUDGET_S (100) and NT_RUN_TIMEOUT_S (30): the runs share the budget, counted from the
#   first run; each is limited to the smaller of its timeout and what is left, and one with
#   less than 5 s left is not started (SKIPPED (time budget)). OUT (/tmp/nccl-tests-run) gets
#   nccl-tests-run.tar.gz (table.txt, BUILD-INFO, logs/); the table is printed too.
#   NT_BIN_ARCHIVE (.device/nccl-tests/nccl-tests.tar.xz) is the archive unpacked when NT_BIN is
#   not given; its folder's BUILD-INFO heads the table.
#   NT_NPROCS (1): processes per run. Above 1 every run is `mpirun -np NT_NPROCS` of binaries
#   built with MPI, all ranks on GPU 0 (NCCL_TESTS_DEVICE=0, NCCL_MULTI_RANK_GPU_ENABLE=1),
#   under MPS (NT_MPS=1, the default then: a daemon of its own, pipe folder
#   /tmp/nccl-tests-mps, stopped at the end; 0 leaves the GPU time-sliced), pinned to
#   2 x NT_NPROCS CPUs near the GPU; rank 0 prints the times. NVIDIA 2.28.9 refuses two ranks
#   on one GPU; 2.32.3 takes them.
#   A run is mostly CUDA and NCCL start-up (11 sizes x 25 operations of at most 8 MiB take
#   milliseconds), about 1-3 s, so the 27 runs need about a minute; unpacking the binaries and
#   NVIDIA 2.32.3 (275 MB) takes a few seconds more. Exits 2 when it cannot run at all (no GPU,
#   no binaries, no library to compare), 1 when a run failed its checks, else 0.
#
# selftest (anywhere): feeds the parser and the table sample nccl-tests output kept in this
#   script (three libraries, one that failed to load, a 0-byte row) and checks the numbers.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
say() { printf '%s\n' "$*"; }
die() { printf 'nccl-tests.sh %s: %s\n' "$mode" "$*" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------
# build

BINS="all_reduce all_gather broadcast reduce reduce_scatter alltoall gather scatter sendrecv"

build() {
  local src=${SRC:-} dest=${DEST:-$root/.device/nccl-tests}
  local cuda=${CUDA_HOME:-$root/.toolchain/py/nvidia/cu13}
  local devinc=${NCCL_DEVICE_INC:-$root/.toolchain/nccl-2.32.3/nvidia/nccl/include}
  local lib=${NCCL_LIB:-}
  [ -n "$src" ] || die "set SRC to a nccl-tests checkout (see the header of this script)"
  if [ ! -f "$src/src/common.h" ] || [ ! -f "$src/src/Makefile" ]; then die "$src is no nccl-tests checkout"; fi
  [ -x "$cuda/bin/nvcc" ] || die "no $cuda/bin/nvcc (set CUDA_HOME)"
  local cudalib=$cuda/lib
  [ -f "$cudalib/libcudart_static.a" ] || cudalib=$cuda/lib64
  [ -f "$cudalib/libcudart_static.a" ] || die "no libcudart_static.a in $cuda/lib or $cuda/lib64 (set CUDA_HOME)"
  local mpi=${NT_MPI_HOME:-} bins=${NT_BUILD_BINS:-$BINS}
  if [ "$mpi" = auto ]; then
    mpi=$(mpicc -showme:incdirs 2>/dev/null | awk '{ print $1 }')
    mpi=${mpi%/}
    mpi=${mpi%/include}
    mpi=${mpi%/include/openmpi}
  fi
  if [ -n "$mpi" ] && [ ! -f "$mpi/include/mpi.h" ]; then die "no include/mpi.h in NT_MPI_HOME ($mpi)"; fi
  if [ ! -f "$devinc/nccl_device.h" ] || [ ! -d "$devinc/nccl_device" ]; then
    die "no nccl_device.h and nccl_device/ in $devinc (set NCCL_DEVICE_INC)"
  fi
  if [ -z "$lib" ]; then
    for lib in "$root/target/release/libnccl.so" "$root/.device/lib/libnccl.so.2" ""; do
      [ -z "$lib" ] || [ -f "$lib" ] && break
    done
  fi
  if [ -z "$lib" ] || [ ! -f "$lib" ]; then die "no libnccl to link against (cargo build --release, or set NCCL_LIB)"; fi
  command -v xz >/dev/null || die "needs xz"
  local ver
  ver=$(sed -n 's/^#define NCCL_TESTS_VERSION "\(.*\)"/\1/p' "$src/src/common.h")
  local tmp
  tmp=$(mktemp -d) || die "mktemp failed"
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  # NCCL_HOME for the Makefile: our nccl.h, NVIDIA's device-API headers beside it (without
  # NVIDIA's nccl.h, which a quoted include would otherwise find first), and lib/libnccl.so
  # whose SONAME libnccl.so.2 is what the binaries record.
  mkdir -p "$tmp/nccl/include" "$tmp/nccl/lib" "$tmp/bin"
  cp "$root/include/nccl.h" "$tmp/nccl/include/"
  cp -r "$devinc/nccl_device.h" "$devinc/nccl_device" "$tmp/nccl/include/"
  cp "$lib" "$tmp/nccl/lib/libnccl.so"
  [ "$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')" = libnccl.so.2 ] ||
    die "$lib has no SONAME libnccl.so.2"
  local targets=() b
  for b in $bins; do targets+=("$tmp/build/${b}_perf"); done
  say "building nccl-tests $ver ($src) with $cuda/bin/nvcc into $dest"
  # The binaries are make targets of their own: alltoallv and hypercube are not built.
  if ! timeout 3600 make -C "$src/src" -j"${JOBS:-2}" MPI="$([ -n "$mpi" ] && echo 1 || echo 0)" MPI_HOME="$mpi" \
    CUDA_HOME="$cuda" CUDA_LIB="$cudalib" \
    CUDARTLIB=cudart_static NCCL_HOME="$tmp/nccl" NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 \
    BUILDDIR="$tmp/build" "${targets[@]}" >"$tmp/make.log" 2>&1; then
    tail -30 "$tmp/make.log"
    die "make failed"
  fi
  local allowed='^(libnccl\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libm\.so\.6|libc\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux-x86-64\.so\.2)$'
  [ -n "$mpi" ] && allowed=${allowed%)\$}'|libmpi\.so\.[0-9]+)$'
  for b in $bins; do
    strip -o "$tmp/bin/${b}_perf" "$tmp/build/${b}_perf" || die "strip ${b}_perf failed"
    local need
    need=$(readelf -d "$tmp/bin/${b}_perf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    local n
    for n in $need; do
      [[ $n =~ $allowed ]] || die "${b}_perf needs $n (only libnccl.so.2 and the C/C++ runtime may be)"
    done
  done
  mkdir -p "$dest"
  rm -f "$dest/nccl-tests.tar.xz" "$dest/BUILD-INFO"
  # A reproducible archive: same binaries, same bytes.
  (cd "$tmp/bin" && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - -- *_perf) |
    xz -9 -T1 >"$dest/nccl-tests.tar.xz" || die "tar failed"
  {
    say "nccl-tests $ver ($(git -C "$src" describe --tags --always 2>/dev/null || echo '?'))"
    say "nvcc: $("$cuda/bin/nvcc" --version | sed -n 's/.*release \(.*\),.*/\1/p'), -gencode=arch=compute_90,code=sm_90, MPI=$([ -n "$mpi" ] && echo "1 ($mpi)" || echo 0), cudart static"
    say "headers: include/nccl.h ($(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$root/include/nccl.h")) + nccl_device from ${devinc#"$root"/}"
    say "binaries: $bins (stripped, in nccl-tests.tar.xz)"
    say "needs: libnccl.so.2 (LD_LIBRARY_PATH), $(readelf -d "$tmp/bin/all_reduce_perf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -v libnccl | tr '\n' ' ')"
  } >"$dest/BUILD-INFO"
  cat "$dest/BUILD-INFO"
  say "$(du -b "$dest/nccl-tests.tar.xz" | cut -f1) bytes in $dest/nccl-tests.tar.xz, $(du -sb "$tmp/bin" | cut -f1) bytes unpacked"
}

# source: the nccl-tests checkout and NVIDIA's device-API headers in one small archive.
source_pack() {
  local src=${SRC:-} dest=${DEST:-$root/.device/nccl-tests}
  local devinc=${NCCL_DEVICE_INC:-$root/.toolchain/nccl-2.32.3/nvidia/nccl/include}
  [ -n "$src" ] && [ -f "$src/src/common.h" ] || die "set SRC to a nccl-tests checkout (see the header of this script)"
  if [ ! -f "$devinc/nccl_device.h" ] || [ ! -d "$devinc/nccl_device" ]; then
    die "no nccl_device.h and nccl_device/ in $devinc (set NCCL_DEVICE_INC)"
  fi
  local tmp
  tmp=$(mktemp -d) || die "mktemp failed"
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  mkdir -p "$tmp/nccl-device-include" "$dest"
  tar -C "$src" --exclude=.git -cf - . | { mkdir -p "$tmp/nccl-tests" && tar -C "$tmp/nccl-tests" -xf -; } || die "cannot copy $src"
  cp -r "$devinc/nccl_device.h" "$devinc/nccl_device" "$tmp/nccl-device-include/"
  tar -C "$tmp" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -czf "$dest/nccl-tests-src.tar.gz" \
    nccl-tests nccl-device-include || die "tar failed"
  say "$(du -b "$dest/nccl-tests-src.tar.gz" | cut -f1) bytes in $dest/nccl-tests-src.tar.gz ($(git -C "$src" describe --tags --always 2>/dev/null || echo '?'))"
}

# ---------------------------------------------------------------------------------------------
# parsing and the table (used by run and selftest)

# parse_log LOG: "size<TAB>time<TAB>wrong" for each result row, time and #wrong out of place.
# The time column is found from the header line (size count type redop root time ...).
parse_log() {
  awk 'BEGIN { OFS = "\t"; tc = 6; wc = 9 }
    /^#/ && / size / && / time / {
      n = 0
      for (i = 2; i <= NF; i++) { n++; if ($i == "time" && !t) { t = n; tc = n; wc = n + 3 } }
      next
    }
    /^ *[0-9]+ +[0-9]+ / && NF >= wc && $tc ~ /^[0-9.e+]+$/ { print $1, $tc, $wc }' "$1"
}

declare -A is_oxccl=()
# check_run LOG LIBDIR FILE SUBJECT: print "ok<TAB>version<TAB>" or "fail<TAB>version<TAB>reason"
# for one run (version empty when the run did not get as far as loading the library).
# LOG.out is the output, LOG.rc the exit status, LOG.ld.* the loader's log, LOG.nccl* NCCL's
# debug output; LIBDIR the folder given as LD_LIBRARY_PATH, FILE the library it points at;
# SUBJECT 1 for the library the ratio is about (it must be oxccl), 0 for the others (not).
check_run() {
  local log=$1 dir=$2 file=$3 subject=$4 rc loaded code banner ver oxccl=0 err
  rc=$(cat "$log.rc" 2>/dev/null || echo "?")
  loaded=$(cat "$log".ld.* 2>/dev/null | sed -n 's/.*calling init: \(.*\/libnccl\.so\.2\)$/\1/p' | head -1)
  err=$(grep -v '^#' "$log.out" 2>/dev/null | grep -i -m1 -E 'error|fail|cannot|not found|insufficient' | cut -c1-160)
  if [ -z "$loaded" ]; then
    printf 'fail\t\tlibnccl.so.2 not loaded (exit %s%s)\n' "$rc" "${err:+: $err}"
    return
  fi
  if [ "$loaded" != "$dir/libnccl.so.2" ]; then
    printf 'fail\t\tloaded %s, not %s/libnccl.so.2\n' "$loaded" "$dir"
    return
  fi
  code=$(sed -n 's/^# nccl-tests version .* nccl-library=\([0-9]*\).*/\1/p' "$log.out" | head -1)
  [ -n "$code" ] || { printf 'fail\t\tnccl-tests printed no nccl-library= line (exit %s%s)\n' "$rc" "${err:+: $err}"; return; }
  # Whether the file is oxccl (it holds the text "+oxccl"), looked at once per file.
  if [ -z "${is_oxccl[$file]:-}" ]; then
    is_oxccl[$file]=0
    grep -aq '+oxccl' "$file" && is_oxccl[$file]=1
  fi
  oxccl=${is_oxccl[$file]}
  banner=$(cat "$log".nccl* 2>/dev/null | grep -o 'NCCL version [^ ]*' | head -1 | cut -d' ' -f3)
  if [ -n "$banner" ]; then ver=$banner
  else
    ver="$((code / 10000)).$((code % 10000 / 100)).$((code % 100))"
    [ "$oxccl" = 1 ] && ver="$ver+oxccl"
    ver="$ver (ncclGetVersion)"
  fi
  if [ "$subject" = 1 ] && [ "$oxccl" = 0 ]; then printf 'fail\t%s\tnot oxccl, yet first in the list\n' "$ver"; return; fi
  if [ "$subject" = 0 ] && [ "$oxccl" = 1 ]; then printf 'fail\t%s\toxccl, not NVIDIA'"'"'s\n' "$ver"; return; fi
  if [ "$rc" != 0 ]; then
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && err="timed out"
    printf 'fail\t%s\texit %s%s\n' "$ver" "$rc" "${err:+: $err}"
    return
  fi
  local rows wrong
  rows=$(parse_log "$log.out")
  [ -n "$rows" ] || { printf 'fail\t%s\tno result rows\n' "$ver"; return; }
  wrong=$(printf '%s\n' "$rows" | awk -F'\t' '$3 != "0" && $3 != "N/A" { n++ } END { print n + 0 }')
  [ "$wrong" = 0 ] || { printf 'fail\t%s\t%s sizes with wrong elements\n' "$ver" "$wrong"; return; }
  printf 'ok\t%s\t\n' "$ver"
}

# table COLL DATA LABEL...: the table of one collective from DATA/COLL/LABEL.rows (runs that
# passed check_run only); the first LABEL is the subject. Prints the table; appends the
# summary line to DATA/summary.
table() {
  local coll=$1 data=$2
  shift 2
  local l
  for l in "$@"; do
    [ -f "$data/$coll/$l.rows" ] && sed "s/^/$l\t/" "$data/$coll/$l.rows"
  done | awk -F'\t' -v labels="$*" -v coll="$coll" -v sumfile="$data/summary" '
    function hsize(s) {
      if (s < 1024) return s " B"
      if (s < 1048576) return (s % 1024 ? sprintf("%.1f", s / 1024) : s / 1024) " KiB"
      return (s % 1048576 ? sprintf("%.1f", s / 1048576) : s / 1048576) " MiB"
    }
    { t[$1, $2] = $3; if (!(($2) in seen)) { seen[$2] = 1; S[++ns] = $2 } }
    END {
      nl = split(labels, L, " ")
      if (ns == 0) { print "(no results)"; printf "%-15s no results\n", coll >> sumfile; exit }
      for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++) if (S[j] + 0 < S[i] + 0) { x = S[i]; S[i] = S[j]; S[j] = x }
      printf "| %9s |", "size"
      for (k = 1; k <= nl; k++) { w[k] = length(L[k]) < 8 ? 8 : length(L[k]); printf " %*s |", w[k], L[k] }
      printf " %6s |\n", "ratio"
      printf "|-----------|"; for (k = 1; k <= nl; k++) { printf "-"; for (c = 0; c <= w[k]; c++) printf "-"; printf "|" }; printf "--------|\n"
      nr = 0; worst = ""; wsize = ""
      for (i = 1; i <= ns; i++) {
        s = S[i]; best = ""
        printf "| %9s |", hsize(s)
        for (k = 1; k <= nl; k++) {
          v = ((L[k], s) in t) ? t[L[k], s] : "n/a"
          printf " %*s |", w[k], v
          if (k > 1 && v != "n/a" && (best == "" || v + 0 < best + 0)) best = v
        }
        if (((L[1], s) in t) && best != "" && best + 0 > 0 && s + 0 > 0) {
          r = t[L[1], s] / best; R[++nr] = r; printf " %6.2f |\n", r
          if (s + 0 <= 8388608 && (worst == "" || r > worst)) { worst = r; wsize = s }
        } else printf " %6s |\n", "-"
      }
      if (nr == 0) { printf "%-15s no ratio: %s\n", coll, (nl < 2 ? "no other library" : "no size with both " L[1] " and another library") >> sumfile; exit }
      for (i = 1; i <= nr; i++) for (j = i + 1; j <= nr; j++) if (R[j] < R[i]) { x = R[i]; R[i] = R[j]; R[j] = x }
      med = (nr % 2) ? R[(nr + 1) / 2] : (R[nr / 2] + R[nr / 2 + 1]) / 2
      if (worst == "") printf "%-15s median ratio %.2f (%d sizes), no size up to 8 MiB\n", coll, med, nr >> sumfile
      else printf "%-15s worst ratio <= 8 MiB %.2f at %s, median ratio %.2f (%d sizes)\n", coll, worst, hsize(wsize), med, nr >> sumfile
    }'
}

# levels DATA COLLS LABEL...: each run's mean time over the sizes from 1 B to 128 KiB, per
# collective and library, in run order, and the first library's best run over the best run of
# any other ("best"). A one-rank run's small sizes all cost one launch, and a process keeps one
# level for all of them (the CPU its calling thread runs on moves every library by 1-2 µs), so
# this says which level each run landed on, and "best" compares the libraries at their best.
levels() {
  local data=$1 colls=$2 coll l n f line
  shift 2
  say "## each run's mean µs over 1 B-128 KiB, in run order"
  line="| collective |"
  for l in "$@"; do line+=" $l |"; done
  say "$line best |"
  line="|---|"
  for l in "$@"; do line+="---|"; done
  say "$line---|"
  for coll in $colls; do
    line="| $coll |"
    local bests=()
    for l in "$@"; do
      local means=()
      local runs=()
      for f in "$data/$coll/$l".rows.*; do [ -f "$f" ] && runs+=("${f##*.}"); done
      for n in $(printf '%s\n' ${runs[@]+"${runs[@]}"} | sort -n); do
        f=$data/$coll/$l.rows.$n
        means+=("$(awk -F'\t' '$1 > 0 && $1 <= 131072 { s += $2; k++ } END { if (k) printf "%.2f", s / k }' "$f")")
      done
      local joined
      joined=$(printf '%s, ' "${means[@]}")
      joined=${joined%, }
      line+=" ${joined:-n/a} |"
      bests+=("$(printf '%s\n' "${means[@]}" | awk 'NF && (b == "" || $1 < b) { b = $1 } END { print (b == "" ? "-" : b) }')")
    done
    say "$line $(printf '%s\n' "${bests[@]}" | awk 'NR == 1 { a = $1; next }
      $1 != "-" && (o == "" || $1 < o) { o = $1 }
      END { if (a == "-" || o == "" || o == 0) print "-"; else printf "%.2f", a / o }') |"
  done
}

# report DATA COLLS LABEL...: the libraries, the tables, the notes and the summary.
report() {
  local data=$1 colls=$2 coll l st
  shift 2
  : >"$data/summary"
  for coll in $colls; do
    say ""
    say "## $coll"
    table "$coll" "$data" "$@"
    for l in "$@"; do
      st="$data/$coll/$l.status"
      [ -f "$st" ] || continue
      case $(cut -f1 "$st") in
        ok) ;;
        *) say "  $l: n/a: $(awk -F'\t' '{ print ($2 == "" ? "" : $2 ": ") $3 }' "$st")" ;;
      esac
    done
  done
  say ""
  say "## summary (ratio = $1 / fastest of: ${*:2})"
  cat "$data/summary"
  say ""
  levels "$data" "$colls" "$@"
}

# ---------------------------------------------------------------------------------------------
# run

# run_one COLL LABEL LIBDIR LIBFILE SUBJECT BIN LOGDIR DATA TIMEOUT RUN: run number RUN of a
# library; its rows go to DATA/COLL/LABEL.rows.RUN, its status to DATA/COLL/LABEL.status.RUN.
run_one() {
  local coll=$1 label=$2 dir=$3 file=$4 subject=$5 bin=$6 logs=$7 data=$8 t=$9 n=${10} log rc t0=$SECONDS
  log=$logs/$coll.$label.$n
  rm -f "$log".*
  # shellcheck disable=SC2086 # NT_ARGS is a list of arguments
  env -u LD_BIND_NOW LD_LIBRARY_PATH="$dir" NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO \
    NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_FILE="$log.nccl.%p" LD_DEBUG=libs LD_DEBUG_OUTPUT="$log.ld" \
    timeout -k 5 "$t" ${pin[@]+"${pin[@]}"} ${launch[@]+"${launch[@]}"} "$bin/${coll}_perf" -g 1 $args >"$log.out" 2>&1 </dev/null
  rc=$?
  echo "$rc" >"$log.rc"
  mkdir -p "$data/$coll"
  check_run "$log" "$dir" "$file" "$subject" >"$data/$coll/$label.status.$n"
  if [ "$(cut -f1 "$data/$coll/$label.status.$n")" = ok ]; then parse_log "$log.out" >"$data/$coll/$label.rows.$n"; fi
  printf '  %-15s %-8s run %s %3ss (%3ss in all) %s\n' "$coll" "$label" "$n" "$((SECONDS - t0))" "$((SECONDS - t_run))" \
    "$(cut -f1,3 "$data/$coll/$label.status.$n" | tr '\t' ' ')"
}

# merge_runs DIR LABEL: the runs of one library for one collective as one: LABEL.status is the
# first failed run's status (else the first run's), LABEL.rows each size's median time over the
# runs that passed (the lower middle of an even count) and its largest wrong count.
merge_runs() {
  local dir=$1 label=$2 st
  st=$(cat "$dir/$label".status.* 2>/dev/null | awk -F'\t' '$1 != "ok" { print; f = 1; exit } NR == 1 { first = $0 } END { if (!f && NR) print first }')
  [ -n "$st" ] || return 0
  printf '%s\n' "$st" >"$dir/$label.status"
  [ "${st%%$'\t'*}" = ok ] || return 0
  cat "$dir/$label".rows.* | sort -t$'\t' -k1,1n -k2,2g | awk -F'\t' 'BEGIN { OFS = "\t" }
    function flush() { if (n) print size, v[int((n + 1) / 2)], w }
    !seen || $1 != size { flush(); seen = 1; size = $1; n = 0; w = 0 }
    { v[++n] = $2; if ($3 != "0" && $3 != "N/A") w = $3; else if (w == 0) w = $3 }
    END { flush() }' >"$dir/$label.rows"
}

# MPS for the runs of several processes: a daemon of its own, stopped when the run ends.
mps=0
mps_dir=/tmp/nccl-tests-mps
start_mps() {
  mkdir -p "$mps_dir"
  export CUDA_MPS_PIPE_DIRECTORY=$mps_dir CUDA_MPS_LOG_DIRECTORY=$mps_dir
  if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then
    mps=1
    say "$nprocs processes per run on GPU 0, under MPS (daemon started; stopped at the end)"
  else
    say "$nprocs processes per run on GPU 0; no MPS daemon could start: the GPU is time-sliced"
  fi
}
stop_mps() {
  if [ "$mps" = 1 ]; then echo quit | nvidia-cuda-mps-control; mps=0; fi
}

run() {
  local out=${OUT:-/tmp/nccl-tests-run}
  # Every run pinned to the same CPUs near GPU 0 (NT_CPUS, default scripts/gpu-cpus 2; "none":
  # not pinned): which CPU a process runs on moves a call by 1-2 µs (CPU 0 is the slow one).
  # Two, not one: on one CPU a library's own threads take turns with the caller's.
  local nprocs=${NT_NPROCS:-1}
  [[ $nprocs =~ ^[1-9][0-9]*$ ]] || die "NT_NPROCS must be a count of processes, not $nprocs"
  local cpus=${NT_CPUS:-$("$here/gpu-cpus" $((2 * nprocs)))}
  local repeat=${NT_REPEAT:-3}
  pin=()
  [[ -n $cpus && $cpus != none ]] && command -v taskset >/dev/null && pin=(taskset -c "$cpus")
  say "runs pinned to CPUs: ${cpus:-none}; $repeat runs per library, in turns, medians per size"
  launch=()
  if [ "$nprocs" -gt 1 ]; then
    command -v mpirun >/dev/null || die "NT_NPROCS=$nprocs needs mpirun"
    # Every rank on GPU 0, and the environment each process needs named for mpirun.
    export NCCL_TESTS_DEVICE=0 NCCL_MULTI_RANK_GPU_ENABLE=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    launch=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$nprocs")
    local v
    for v in LD_LIBRARY_PATH NCCL_NVLS_ENABLE NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE LD_DEBUG LD_DEBUG_OUTPUT \
      NCCL_TESTS_DEVICE NCCL_MULTI_RANK_GPU_ENABLE; do launch+=(-x "$v"); done
  fi
  local colls=${NT_COLLS:-all_reduce all_gather reduce_scatter broadcast reduce alltoall gather scatter sendrecv}
  args=${NT_ARGS:--b 8 -e 8M -f 4 -w 5 -n 20 -c 1 -d float}
  local budget=${NT_BUDGET_S:-100} run_to=${NT_RUN_TIMEOUT_S:-30}
  local libs=${NT_LIBS:-ours=.device/lib/libnccl.so.2 nv2289=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2 nv2323=.device/ref/lib/libnccl.so.2}
  cd "$root" || die "cannot cd to $root"
  if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    die "no NVIDIA GPU here (no /dev/nvidia0): run this on the GPU machine"
  fi
  if command -v nvidia-smi >/dev/null && ! timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    die "nvidia-smi -L lists no GPU: run this on the GPU machine"
  fi
  local work
  work=$(mktemp -d) || die "mktemp failed"
  # shellcheck disable=SC2064 # expand now: work is local
  trap "rm -rf '$work'; stop_mps" EXIT
  if [ "$nprocs" -gt 1 ]; then
    if [ "${NT_MPS:-1}" = 1 ]; then
      start_mps
    else
      say "$nprocs processes per run on GPU 0, time-sliced (NT_MPS=0)"
    fi
  fi
  local bin=${NT_BIN:-} archive=${NT_BIN_ARCHIVE:-.device/nccl-tests/nccl-tests.tar.xz}
  if [ -z "$bin" ]; then
    [ -f "$archive" ] ||
      die "no $archive (scripts/nccl-tests.sh build here, then carry .device/nccl-tests)"
    mkdir -p "$work/bin"
    timeout 60 tar -C "$work/bin" -xJf "$archive" || die "cannot unpack $archive"
    bin=$work/bin
  fi
  local info
  info=$(dirname "$archive")/BUILD-INFO
  local c
  for c in $colls; do [ -x "$bin/${c}_perf" ] || die "no $bin/${c}_perf"; done
  if [ -f .device/ref/libnccl-2.32.3.so.2.xz ] && case " $libs " in *=.device/ref/lib/libnccl.so.2\ *) true ;; *) false ;; esac &&
    { [ ! -f .device/ref/lib/libnccl.so.2 ] || [ .device/ref/libnccl-2.32.3.so.2.xz -nt .device/ref/lib/libnccl.so.2 ]; }; then
    mkdir -p .device/ref/lib
    if ! timeout 60 xz -dc .device/ref/libnccl-2.32.3.so.2.xz >.device/ref/lib/libnccl.so.2.part; then
      rm -f .device/ref/lib/libnccl.so.2.part
      say "cannot unpack .device/ref/libnccl-2.32.3.so.2.xz"
    else
      mv .device/ref/lib/libnccl.so.2.part .device/ref/lib/libnccl.so.2
    fi
  fi
  local data=$work/data logs=$work/logs labels=() dirs=() files=() entry label path i
  mkdir -p "$data" "$logs"
  {
    say "# nccl-tests: $(head -1 "$info" 2>/dev/null || echo "binaries from $bin")$(grep -o 'MPI=1 ([^)]*)' "$info" 2>/dev/null | sed 's/^/, /')"
    say "# GPU: $(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
    say "# ${launch[*]:+${launch[*]%% -x *} }<collective>_perf -g 1 $args; NCCL_NVLS_ENABLE=0; out-of-place time per operation in us"
    [ "$nprocs" -gt 1 ] && say "# $nprocs processes on GPU 0 ($([ $mps = 1 ] && echo "under MPS" || echo "time-sliced")); rank 0's times"
    say "# libraries (version as loaded, file):"
  } >"$work/head"
  local skipped=()
  for entry in $libs; do
    label=${entry%%=*} path=${entry#*=}
    if [ "$label" = "$entry" ] || [ -z "$label" ]; then die "NT_LIBS entries are label=path, not $entry"; fi
    if [ ! -f "$path" ]; then
      [ ${#labels[@]} -gt 0 ] || die "the library to compare ($label) is missing: $path"
      say "SKIPPED $label: no $path"
      skipped+=("$label $path")
      continue
    fi
    mkdir -p "$work/lib/$label"
    ln -s "$(readlink -f "$path")" "$work/lib/$label/libnccl.so.2"
    labels+=("$label") dirs+=("$work/lib/$label") files+=("$(readlink -f "$path")")
  done
  [ ${#labels[@]} -ge 2 ] || say "only ${labels[*]} is here: no ratio"
  say "running ${colls// /, } with ${labels[*]} (budget ${budget}s)"
  t_run=$SECONDS
  local left t failed=0
  local n
  for c in $colls; do
    # The libraries take turns, NT_REPEAT rounds: each size's time is the median of its runs.
    for ((n = 1; n <= repeat; n++)); do
      for i in "${!labels[@]}"; do
        left=$((budget - (SECONDS - t_run)))
        t=$((left < run_to ? left : run_to))
        if [ "$t" -lt 5 ]; then
          mkdir -p "$data/$c"
          # A later round cut by the budget leaves the rounds that ran.
          [ "$n" -gt 1 ] && continue
          printf 'fail\t\tSKIPPED (time budget: %ss of %ss used)\n' "$((SECONDS - t_run))" "$budget" >"$data/$c/${labels[$i]}.status.$n"
          continue
        fi
        run_one "$c" "${labels[$i]}" "${dirs[$i]}" "${files[$i]}" "$([ "$i" = 0 ] && echo 1 || echo 0)" \
          "$bin" "$logs" "$data" "$t" "$n"
      done
    done
    for i in "${!labels[@]}"; do
      merge_runs "$data/$c" "${labels[$i]}"
      [ "$(cut -f1 "$data/$c/${labels[$i]}.status" 2>/dev/null)" = ok ] || failed=1
    done
  done
  for i in "${!labels[@]}"; do
    # The version every run of a library reported (one line when they agree).
    local vers
    vers=$(cat "$data"/*/"${labels[$i]}.status" | awk -F'\t' '$2 != "" { sub(/ \(.*/, "", $2); print $2 }' | sort -u | paste -sd, -)
    printf '#   %-8s %-28s %s\n' "${labels[$i]}" "${vers:-(no run loaded it)}" "${files[$i]}" >>"$work/head"
  done
  for entry in "${skipped[@]}"; do
    printf '#   %-8s %-28s %s\n' "${entry%% *}" "SKIPPED (missing)" "${entry#* }" >>"$work/head"
  done
  { cat "$work/head"; report "$data" "$colls" "${labels[@]}"; } >"$work/table.txt"
  mkdir -p "$out"
  local keep=(table.txt logs)
  cp "$info" "$work/" 2>/dev/null && keep+=(BUILD-INFO)
  tar -C "$work" -czf "$out/nccl-tests-run.tar.gz" "${keep[@]}"
  say ""
  cat "$work/table.txt"
  say ""
  say "took $((SECONDS - t_run))s; logs and table: $out/nccl-tests-run.tar.gz"
  return $failed
}

# ---------------------------------------------------------------------------------------------
# selftest

# sample_log FILE LIBRARY_CODE COLL REDOP ROOT "size:time:wrong ...": nccl-tests 2.19.6 output,
# as printed by `all_reduce_perf -g 1 -b 8 -e 8M -f 4 -w 5 -n 20 -c 1 -d float` on one H200
# (the in-place columns repeat the out-of-place time plus 0.1 us, to tell them apart).
sample_log() {
  local f=$1 code=$2 coll=$3 redop=$4 root=$5 rows=$6 r size time wrong
  {
    printf '# nccl-tests version 2.19.6 nccl-headers=23203 nccl-library=%s\n' "$code"
    printf '# Collective test starting: %s_perf\n' "$coll"
    printf '# nThread 1 nGpus 1 minBytes 8 maxBytes 8388608 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n#\n'
    printf '# Using devices\n#  Rank  0 Group  0 Pid  41237 on  gpu-node1 device  0 [0000:19:00] NVIDIA H200\n#\n'
    printf '# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n' "" "" "" "" ""
    printf '# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n' size count type redop root \
      time algbw busbw '#wrong' time algbw busbw '#wrong'
    printf '# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n' '(B)' '(elements)' "" "" "" \
      '(us)' '(GB/s)' '(GB/s)' "" '(us)' '(GB/s)' '(GB/s)' ""
    for r in $rows; do
      IFS=: read -r size time wrong <<<"$r"
      printf '%12li  %12li  %8s  %6s  %6s' "$size" "$((size / 4))" float "$redop" "$root"
      printf '  %7.2f  %6.2f  %6.2f  %6g' "$time" "$(echo "$size $time" | awk '{ print $1 / $2 / 1000 }')" 0 "$wrong"
      printf '  %7.2f  %6.2f  %6.2f  %6g\n' "$(echo "$time" | awk '{ print $1 + 0.1 }')" 0 0 "$wrong"
    done
    printf '# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0 \n#\n# Collective test concluded: %s_perf\n\n' "$coll"
  } >"$f"
}

selftest() {
  local work fails=0
  work=$(mktemp -d) || die "mktemp failed"
  # shellcheck disable=SC2064 # expand now: work is local
  trap "rm -rf '$work'" EXIT
  local logs=$work/logs data=$work/data l
  mkdir -p "$logs" "$data"
  for l in ours nv2289 nv2323; do mkdir -p "$work/lib/$l"; done
  printf 'x\0fmt {}.{}.{}+oxccl\0' >"$work/lib/ours/libnccl.so.2"
  printf 'x\0NCCL version 2.28.9+cuda13.0\0' >"$work/lib/nv2289/libnccl.so.2"
  printf 'x\0NCCL version 2.32.3+cuda13.0\0' >"$work/lib/nv2323/libnccl.so.2"
  # A run: its output, status, loader log and NCCL debug file as run_one leaves them.
  fake() { # COLL LABEL CODE RC BANNER REDOP ROOT ROWS
    local log=$logs/$1.$2
    sample_log "$log.out" "$3" "$1" "$6" "$7" "$8"
    echo "$4" >"$log.rc"
    printf '     41237:\tfind library=libnccl.so.2 [0]; searching\n     41237:\t  trying file=%s/libnccl.so.2\n     41237:\tcalling init: %s/libnccl.so.2\n' \
      "$work/lib/$2" "$work/lib/$2" >"$log.ld.41237"
    [ -z "$5" ] || printf 'gpu-node1:41237:41237 [0] NCCL INFO NCCL version %s\n' "$5" >"$log.nccl"
  }
  local s="8 32 128 512 2048 8192 32768 131072 524288 2097152 8388608"
  rows() { local a=("$@") i=0 x out=""; for x in $s; do out+=" $x:${a[$i]}:0"; i=$((i + 1)); done; echo "$out"; }
  # all_reduce: ours 5.00 at every size up to 512 KiB, 12.00 at 2 MiB and 8 MiB.
  fake all_reduce ours 23203 0 "" sum -1 "$(rows 5 5 5 5 5 5 5 5 5 12 12)"
  fake all_reduce nv2289 22809 0 "2.28.9+cuda13.0" sum -1 "$(rows 10 10 10 10 10 10 10 10 4 10 30)"
  fake all_reduce nv2323 23203 0 "2.32.3+cuda13.0" sum -1 "$(rows 8 8 8 8 8 8 8 8 8 6 6)"
  # alltoall: 8 B is 0 bytes per rank (a 0-byte row, no ratio); nv2323 did not load.
  fake alltoall ours 23203 0 "2.32.3+oxccl" none -1 "0:3.00:0 32:6.00:0 128:6.00:0 524288:9.00:0"
  fake alltoall nv2289 22809 0 "2.28.9+cuda13.0" none -1 "0:1.00:0 32:4.00:0 128:8.00:0 524288:3.00:0"
  printf '%s\n' "all_reduce_perf: error while loading shared libraries: libnccl.so.2: cannot open shared object file: No such file or directory" >"$logs/alltoall.nv2323.out"
  echo 127 >"$logs/alltoall.nv2323.rc"
  # broadcast: wrong elements with nv2289, and nv2323 is oxccl in disguise.
  fake broadcast ours 23203 0 "" none 0 "8:5.00:0 64:5.00:0"
  fake broadcast nv2289 22809 1 "2.28.9+cuda13.0" none 0 "8:5.00:0 64:5.00:2"
  fake broadcast nv2323 23203 0 "2.32.3+oxccl" none 0 "8:5.00:0 64:5.00:0"
  cp "$work/lib/ours/libnccl.so.2" "$work/lib/nv2323/oxccl.so"
  local c i labels=(ours nv2289 nv2323)
  for c in all_reduce alltoall broadcast; do
    mkdir -p "$data/$c"
    for i in 0 1 2; do
      l=${labels[$i]}
      local file=$work/lib/$l/libnccl.so.2
      [ "$c/$l" = broadcast/nv2323 ] && file=$work/lib/nv2323/oxccl.so
      check_run "$logs/$c.$l" "$work/lib/$l" "$file" "$([ $i = 0 ] && echo 1 || echo 0)" >"$data/$c/$l.status.1"
      [ "$(cut -f1 "$data/$c/$l.status.1")" = ok ] && parse_log "$logs/$c.$l.out" >"$data/$c/$l.rows.1"
    done
  done
  # Two more runs of ours' all_reduce, one slower and one faster at every size: the median
  # is the first run's time.
  for i in 2 3; do
    cp "$data/all_reduce/ours.status.1" "$data/all_reduce/ours.status.$i"
    awk -F'\t' -v d=$(( i == 2 ? 2 : -1 )) 'BEGIN { OFS = "\t" } { $2 = sprintf("%.2f", $2 + d); print }' \
      "$data/all_reduce/ours.rows.1" >"$data/all_reduce/ours.rows.$i"
  done
  for c in all_reduce alltoall broadcast; do
    for l in "${labels[@]}"; do merge_runs "$data/$c" "$l"; done
  done
  report "$data" "all_reduce alltoall broadcast" "${labels[@]}" >"$work/table.txt"
  cat "$work/table.txt"
  expect() { # what: a fixed string that must be in the table
    if grep -qF -- "$1" "$work/table.txt"; then say "ok    $1"; else say "FAIL  missing: $1"; fails=$((fails + 1)); fi
  }
  expect_not() {
    if grep -qF -- "$1" "$work/table.txt"; then say "FAIL  unexpected: $1"; fails=$((fails + 1)); else say "ok    not: $1"; fi
  }
  # parse_log takes the out-of-place time, not the in-place one (+0.1).
  if [ "$(parse_log "$logs/all_reduce.nv2289.out" | head -1)" = "$(printf '8\t10.00\t0')" ]; then say "ok    parse_log 8 B row"
  else say "FAIL  parse_log: $(parse_log "$logs/all_reduce.nv2289.out" | head -1)"; fails=$((fails + 1)); fi
  # 8 B: 5 / min(10, 8) = 0.62 (0.625); 512 KiB: 5 / 4 = 1.25; 2 MiB: 12 / 6 = 2.00; 8 MiB 12 / 6.
  expect "|       8 B |     5.00 |    10.00 |     8.00 |   0.62 |"
  expect "|   512 KiB |     5.00 |     4.00 |     8.00 |   1.25 |"
  expect "|     8 MiB |    12.00 |    30.00 |     6.00 |   2.00 |"
  # ratios: 0.625 x8, 1.25, 2, 2: sorted median is the 6th of 11 = 0.625.
  expect "all_reduce      worst ratio <= 8 MiB 2.00 at 2 MiB, median ratio 0.62 (11 sizes)"
  expect "|       0 B |     3.00 |     1.00 |      n/a |      - |"
  expect "|      32 B |     6.00 |     4.00 |      n/a |   1.50 |"
  expect "alltoall        worst ratio <= 8 MiB 3.00 at 512 KiB, median ratio 1.50 (3 sizes)"
  expect "  nv2323: n/a: libnccl.so.2 not loaded (exit 127: all_reduce_perf: error while loading shared libraries"
  expect "  nv2289: n/a: 2.28.9+cuda13.0: exit 1"
  expect "  nv2323: n/a: 2.32.3+oxccl: oxccl, not NVIDIA's"
  expect "broadcast       no ratio: no size with both ours and another library"
  expect_not "|     8 MiB |    12.10"
  # Each run's level: ours' three all_reduce runs at 5, 7 and 4 up to 128 KiB; alltoall's 0 B
  # and 512 KiB rows left out; no run of nv2323's alltoall passed.
  # best: ours' 4.00 over the faster other's 8.00; alltoall 6.00 over 6.00.
  expect "| all_reduce | 5.00, 7.00, 4.00 | 10.00 | 8.00 | 0.50 |"
  expect "| alltoall | 6.00 | 6.00 | n/a | 1.00 |"
  # A run that loaded the library from elsewhere does not count.
  sed -i "s|calling init: .*|calling init: /usr/lib/libnccl.so.2|" "$logs/all_reduce.nv2289.ld.41237"
  case $(check_run "$logs/all_reduce.nv2289" "$work/lib/nv2289" "$work/lib/nv2289/libnccl.so.2" 0) in
    "fail		loaded /usr/lib/libnccl.so.2, not "*) say "ok    a library loaded from elsewhere is refused" ;;
    *) say "FAIL  a library loaded from elsewhere was accepted"; fails=$((fails + 1)) ;;
  esac
  # Ours without a banner: the version comes from nccl-library= and the file.
  case $(check_run "$logs/all_reduce.ours" "$work/lib/ours" "$work/lib/ours/libnccl.so.2" 1) in
    "ok	2.32.3+oxccl (ncclGetVersion)	") say "ok    version from ncclGetVersion" ;;
    *) say "FAIL  version from ncclGetVersion"; fails=$((fails + 1)) ;;
  esac
  if [ $fails = 0 ]; then say "selftest: all checks passed"; else say "selftest: $fails checks failed"; return 1; fi
}

mode=${1:-}
case $mode in
  source) source_pack ;;
  build) build ;;
  run) run ;;
  selftest) selftest ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
