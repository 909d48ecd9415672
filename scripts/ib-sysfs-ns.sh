#!/usr/bin/env bash
# ib-sysfs-ns.sh: runs a command in a mount namespace of its own in which the software verbs
# device (ffi-tests/ibverbs/soft_verbs.c, "soft_0") has the sysfs entry a real HCA has:
# /sys/class/infiniband/soft_0/device, a link to a real PCI function, and the GID types of
# its ports (ports/<p>/gid_attrs/types/<i>), which NVIDIA's NCCL reads on RoCE. NVIDIA's NCCL takes the
# NIC's PCI path from realpath() of that link (ncclIbGetPciPath); without it, it warns "Could
# not find real path of soft_0" and places the NIC on the first CPU (a virtual NIC), which
# also works. See ffi-tests/ibverbs/NVIDIA_IB.md.
#
# Usage: scripts/ib-sysfs-ns.sh [--dev NAME] [--pci PATH|auto] -- COMMAND [ARGS...]
#   --dev   the device name (default soft_0)
#   --pci   the PCI function the link points to (default auto: a network-class function at
#           device 00 function 0, as NCCL rewrites a path's device and function digits to 0
#           when it merges virtual functions; else a network-class function 0 of another device
#           number, with NCCL_IB_MERGE_VFS=0 exported so that NCCL keeps its path as it is)
# How: `unshare -m` (root with CAP_SYS_ADMIN), else `unshare -Urm` (an unprivileged user
# namespace). When /sys/class/infiniband exists a tmpfs covers it; otherwise a tmpfs covers
# /sys/class, every original class directory is bind-mounted back into it, and infiniband/ is
# added. Nothing outside the namespace changes; it ends with the command.
# Exit status: the command's; 96 when the namespace or the tree cannot be made (the message
# says why: unshare not permitted, no PCI network device, mount refused).
set -uo pipefail

dev=soft_0
pci=auto
inner=0
while [ $# -gt 0 ]; do
  case $1 in
    --dev) dev=$2; shift 2 ;;
    --pci) pci=$2; shift 2 ;;
    --inner) inner=1; shift ;;
    --) shift; break ;;
    *) echo "ib-sysfs-ns: unknown option '$1' (usage: --dev NAME --pci PATH|auto -- COMMAND)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "ib-sysfs-ns: no command (usage: ... -- COMMAND [ARGS])" >&2; exit 2; }

fail() { echo "ib-sysfs-ns: $*" >&2; exit 96; }

# Prints the PCI function to link to, and "merge_vfs=0" on a second line when NCCL must keep
# the path's device number.
pick_pci() {
  local d c p
  for want in exact any; do
    for d in /sys/bus/pci/devices/*; do
      c=$(cat "$d/class" 2>/dev/null) || continue
      [[ $c == 0x02* ]] || continue
      p=$(readlink -f "$d") || continue
      if [ $want = exact ] && [[ $p == *:00.0 ]]; then echo "$p"; return 0; fi
      if [ $want = any ] && [[ $p == *.0 ]]; then printf '%s\nmerge_vfs=0\n' "$p"; return 0; fi
    done
  done
  return 1
}

if [ $inner = 0 ]; then
  merge=""
  if [ "$pci" = auto ]; then
    picked=$(pick_pci) || fail "no PCI network-class function (class 0x02*) under /sys/bus/pci/devices to stand for the NIC; pass --pci PATH"
    pci=$(head -n 1 <<<"$picked")
    merge=$(sed -n 2p <<<"$picked")
  fi
  [ -e "$pci" ] || fail "--pci $pci does not exist"
  pci=$(readlink -f "$pci")
  how=()
  if err=$(unshare -m --propagation private true 2>&1); then
    how=(unshare -m --propagation private)
  elif err2=$(unshare -Urm --propagation private true 2>&1); then
    how=(unshare -Urm --propagation private)
  else
    fail "cannot make a mount namespace: 'unshare -m': ${err:-refused}; 'unshare -Urm': ${err2:-refused}"
  fi
  [ -n "$merge" ] && export NCCL_IB_MERGE_VFS=0
  echo "ib-sysfs-ns: ${how[*]}: /sys/class/infiniband/$dev/device -> $pci${merge:+ (NCCL_IB_MERGE_VFS=0: not a device-00 function)}" >&2
  exec "${how[@]}" -- "$0" --inner --dev "$dev" --pci "$pci" -- "$@"
fi

# Inside the namespace: build the tree, then become the command.
if [ -d /sys/class/infiniband ]; then
  mount -t tmpfs -o mode=755 ib-sysfs-ns /sys/class/infiniband || fail "mount tmpfs on /sys/class/infiniband refused"
else
  stage=$(mktemp -d /tmp/ib-sysfs-ns.XXXXXX) || fail "mktemp"
  mkdir "$stage/class" && mount --bind /sys/class "$stage/class" || fail "bind mount of /sys/class refused"
  mount -t tmpfs -o mode=755 ib-sysfs-ns /sys/class || fail "mount tmpfs on /sys/class refused"
  for e in "$stage"/class/*; do
    n=${e##*/}
    mkdir "/sys/class/$n" && mount --bind "$e" "/sys/class/$n" || fail "bind mount of /sys/class/$n refused"
  done
  mkdir /sys/class/infiniband || fail "mkdir /sys/class/infiniband"
fi
# The GID types NVIDIA's NCCL reads on RoCE ports (ncclIbRoceGetVersionNum), as the stand-in's
# GID table has them with SOFT_VERBS_LINK_LAYER=eth: 0 and 2 RoCE v1, 1 and 3 RoCE v2.
for port in 1 2; do
  types=/sys/class/infiniband/$dev/ports/$port/gid_attrs/types
  mkdir -p "$types" || fail "mkdir $types"
  for i in 0 2; do echo "IB/RoCE v1" >"$types/$i"; done
  for i in 1 3; do echo "RoCE v2" >"$types/$i"; done
done
ln -s "$pci" "/sys/class/infiniband/$dev/device" || fail "link /sys/class/infiniband/$dev/device"
[ "$(readlink -f "/sys/class/infiniband/$dev/device")" = "$pci" ] ||
  fail "realpath of /sys/class/infiniband/$dev/device is not $pci"
exec "$@"
