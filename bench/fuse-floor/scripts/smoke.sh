#!/usr/bin/env bash
# End-to-end check of fuse-floor on a real mount (needs root and /dev/fuse).
#
# Mounts a size-capped tmpfs as the backing store, mounts fuse-floor over it,
# then runs the workloads the floor must support: tar x, diff -r, md5sum -c,
# cp -a, rsync -a, ls -lR, rm -rf and a short fio randrw. Everything it
# mounts it unmounts again, also on failure.
#
# usage: bench/fuse-floor/scripts/smoke.sh [path/to/fuse-floor] [extra fuse-floor args...]
set -euo pipefail

FLOOR=${1:-${CARGO_TARGET_DIR:-target}/release/fuse-floor}
shift || true
WORK=$(mktemp -d /tmp/fuse-floor-smoke.XXXXXX)
BACK=$WORK/tmpfs/back
MNT=$WORK/mnt
PIDFILE=$WORK/floor.pid

cleanup() {
    set +e
    if mountpoint -q "$MNT"; then fusermount3 -u "$MNT" || umount -l "$MNT"; fi
    [ -f "$PIDFILE" ] && kill "$(cat "$PIDFILE")" 2>/dev/null
    if mountpoint -q "$WORK/tmpfs"; then umount "$WORK/tmpfs"; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

step() { printf '== %s\n' "$*"; }
# A daemonized fuse-floor is reparented to PID 1, which may reap it late:
# a zombie counts as exited.
alive() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

mkdir -p "$WORK/tmpfs" "$MNT"
mount -t tmpfs -o size=2g tmpfs "$WORK/tmpfs"
mkdir -p "$BACK" "$WORK/tmpfs/src"
tar -C /usr -cf "$WORK/tmpfs/src/include.tar" include

"$FLOOR" --pid-file "$PIDFILE" "$@" "$BACK" "$MNT"
mountpoint -q "$MNT" || { echo "not mounted after fuse-floor returned"; exit 1; }
step "mounted (pid $(cat "$PIDFILE"))"

cd "$MNT"
step "tar x";        tar xf "$WORK/tmpfs/src/include.tar"
step "diff -r";      diff -r /usr/include include
step "md5sum -c";    (cd include && find . -type f -print0 | xargs -0 md5sum > "$WORK/sums" \
                        && md5sum -c --quiet "$WORK/sums")
step "cp -a";        cp -a include include-cp && diff -r include include-cp
step "rsync -a";     rsync -a include/ include-rs/ && diff -r include include-rs
step "ls -lR";       [ "$(ls -lR include | wc -l)" -eq "$(ls -lR /usr/include | wc -l)" ]
step "rm -rf";       rm -rf include include-cp include-rs && [ -z "$(ls -A)" ]
if command -v fio >/dev/null; then
    step "fio randrw"
    fio --name=rw --directory="$MNT" --rw=randrw --bs=4k --size=64m --numjobs=2 \
        --runtime=5 --time_based --ioengine=psync --verify=crc32c --group_reporting \
        --output-format=terse >/dev/null
    rm -f "$MNT"/rw.*
fi
cd /

step "unmount";      fusermount3 -u "$MNT"
for _ in $(seq 50); do alive "$(cat "$PIDFILE")" || break; sleep 0.1; done
if alive "$(cat "$PIDFILE")"; then echo "daemon still running"; exit 1; fi
rm -f "$PIDFILE"
step "all passed"
