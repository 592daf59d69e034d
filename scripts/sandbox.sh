#!/usr/bin/env bash
# Runs a command in a throwaway view of this machine, so that the tests which must change
# machine-wide state (users made with useradd, /etc/fstab, /etc/fuse.conf, the mount helper
# in /usr/sbin, an installed package, /dev/fuse's mode) change nothing outside it:
#
#   scripts/sandbox.sh CMD [ARGS...]        e.g. scripts/sandbox.sh cargo test --release --test system
#
# The command runs in new mount and PID namespaces. /etc, /usr, /var and /run are overlays whose
# changes go to a tmpfs, and /dev/fuse is a device node of its own (same device, own mode).
# When the command ends — also when it is killed — the namespaces go, and with them every
# change, mount and process: nothing needs restoring. Two runs at once do not see each other.
# VEILFS_TEST_SANDBOX=1 tells the tests they may make such changes (tests/common
# `machine_changes`). As an ordinary user (who can change none of this) the command simply runs.
set -euo pipefail
if (($# == 0)); then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  exec "$@"
fi
if [[ "${VEILFS_TEST_SANDBOX:-}" == 1 ]]; then
  exec "$@" # already inside one
fi
if [[ "${1:-}" != --inside ]]; then
  exec unshare --mount --pid --fork --mount-proc --propagation private -- bash "$0" --inside "$@"
fi
shift
scratch=$(mktemp -d /tmp/veilfs-sandbox.XXXXXX)
mount -t tmpfs -o size=2g,mode=0700 tmpfs "$scratch"
# The directory name stays on the host's /tmp: remove it when done (the tmpfs goes with the
# namespace).
trap 'umount -l "$scratch" 2>/dev/null; rmdir "$scratch" 2>/dev/null || true' EXIT
for d in /etc /usr /var /run; do
  mkdir -p "$scratch/upper$d" "$scratch/work$d"
  mount -t overlay overlay -o "lowerdir=$d,upperdir=$scratch/upper$d,workdir=$scratch/work$d" "$d"
done
if [[ -c /dev/fuse ]]; then
  mknod -m "$(stat -c %a /dev/fuse)" "$scratch/fuse" c 10 229
  mount --bind "$scratch/fuse" /dev/fuse
fi
export VEILFS_TEST_SANDBOX=1
"$@"
