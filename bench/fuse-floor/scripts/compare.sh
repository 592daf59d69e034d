#!/usr/bin/env bash
# One-shot sanity comparison: plain tmpfs vs fuse-floor over tmpfs vs
# gocryptfs over tmpfs, on a tarball of /usr/include (~9k entries, ~120 MB).
#
# Per target: untar; then (after a remount for the FUSE targets, so the
# kernel's caches are cold) `ls -lR`, read everything back, `rm -rf`.
# Prints seconds and ratios to tmpfs and to fuse-floor. One run, ~1 minute;
# numbers are indicative only (2 shared cores). Needs root and gocryptfs.
#
# usage: bench/fuse-floor/scripts/compare.sh [path/to/fuse-floor] [extra fuse-floor args...]
set -euo pipefail

FLOOR=${1:-${CARGO_TARGET_DIR:-target}/release/fuse-floor}
shift || true
FLOOR_ARGS=("$@")
WORK=$(mktemp -d /tmp/fuse-floor-compare.XXXXXX)
T=$WORK/tmpfs
RESULTS=$WORK/results

cleanup() {
    set +e
    for m in "$WORK/floor" "$WORK/gocryptfs"; do
        mountpoint -q "$m" && { fusermount3 -u "$m" || umount -l "$m"; }
    done
    [ -f "$WORK/floor.pid" ] && kill "$(cat "$WORK/floor.pid")" 2>/dev/null
    mountpoint -q "$T" && umount "$T"
    rm -rf "$WORK"
}
trap cleanup EXIT

now() { date +%s.%N; }
# A daemonized fuse-floor is reparented to PID 1, which may reap it late:
# a zombie counts as exited.
alive() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
# timed NAME STEP CMD...: run CMD, record "NAME STEP SECONDS"
timed() {
    local name=$1 step=$2 t0
    shift 2
    t0=$(now)
    "$@"
    echo "$name $step $(echo "$(now) - $t0" | bc)" >> "$RESULTS"
}

mount_floor() { "$FLOOR" --pid-file "$WORK/floor.pid" "${FLOOR_ARGS[@]}" "$T/floor-back" "$WORK/floor"; }
umount_floor() {
    fusermount3 -u "$WORK/floor"
    while alive "$(cat "$WORK/floor.pid")"; do sleep 0.05; done
}
mount_gocryptfs() { gocryptfs -q -extpass 'echo pw' "$T/gocryptfs-cipher" "$WORK/gocryptfs"; }
umount_gocryptfs() { fusermount3 -u "$WORK/gocryptfs"; sleep 0.2; }

untar() { tar -C "$1" -xf "$T/include.tar"; }
list() { ls -lR "$1/include" > /dev/null; }
readall() { tar -C "$1" -cf - include | cat > /dev/null; }
remove() { rm -rf "$1/include"; }

mkdir -p "$T" "$WORK/floor" "$WORK/gocryptfs"
mount -t tmpfs -o size=2g tmpfs "$T"
mkdir -p "$T/plain" "$T/floor-back" "$T/gocryptfs-cipher"
tar -C /usr -cf "$T/include.tar" include
gocryptfs -q -init -scryptn 10 -extpass 'echo pw' "$T/gocryptfs-cipher" > /dev/null

# plain tmpfs: the ceiling
timed tmpfs untar untar "$T/plain"
timed tmpfs ls-lR list "$T/plain"
timed tmpfs read readall "$T/plain"
timed tmpfs rm-rf remove "$T/plain"

# fuse-floor over tmpfs
mount_floor
timed fuse-floor untar untar "$WORK/floor"
umount_floor; mount_floor
timed fuse-floor ls-lR list "$WORK/floor"
umount_floor; mount_floor
timed fuse-floor read readall "$WORK/floor"
timed fuse-floor rm-rf remove "$WORK/floor"
umount_floor

# gocryptfs over tmpfs
mount_gocryptfs
timed gocryptfs untar untar "$WORK/gocryptfs"
umount_gocryptfs; mount_gocryptfs
timed gocryptfs ls-lR list "$WORK/gocryptfs"
umount_gocryptfs; mount_gocryptfs
timed gocryptfs read readall "$WORK/gocryptfs"
timed gocryptfs rm-rf remove "$WORK/gocryptfs"
umount_gocryptfs

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
awk '
    { t[$1, $2] = $3; steps[$2] = 1; order[++n] = $2 }
    END {
        printf "%-7s %9s %11s %10s %13s %15s\n", "step", "tmpfs s", "fuse-floor s", "gocryptfs s", "floor/tmpfs", "gocryptfs/floor"
        for (i = 1; i <= n; i++) {
            s = order[i]; if (seen[s]++) continue
            printf "%-7s %9.2f %11.2f %10.2f %12.1fx %14.1fx\n", s, t["tmpfs", s], t["fuse-floor", s], t["gocryptfs", s],
                t["fuse-floor", s] / t["tmpfs", s], t["gocryptfs", s] / t["fuse-floor", s]
        }
    }' "$RESULTS"
