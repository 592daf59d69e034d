#!/usr/bin/env bash
# The mount test group once more as an ordinary user, the way a desktop user mounts: through
# fusermount3, with /dev/fuse open to everyone (mode 0666, as desktop distributions ship it).
# Root runs this (scripts/test.sh does, after `cargo test`); it makes a throwaway user, a
# size-capped tmpfs the user keeps its data on (TMPDIR; a user cannot mount one per test), and
# copies the test binaries there (the build directory may be private, like /root). Everything
# it changes is undone on exit, also on failure. Tests that need root report themselves
# (tests/common `root_only`); they are listed and counted at the end.
#
# Usage: scripts/test-nonroot.sh [TARGET...] [-- LIBTEST-ARGS...]   (TARGET: a tests/*.rs
# name, default: mount)
set -euo pipefail
cd "$(dirname "$0")/.."
# It makes a user and opens /dev/fuse to everyone: only in a throwaway view of the machine.
if [[ $(id -u) -eq 0 && ${VEILFS_TEST_SANDBOX:-} != 1 ]]; then
  exec bash scripts/sandbox.sh bash "$0" "$@"
fi
targets=()
while (($#)) && [[ $1 != -- ]]; do targets+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
((${#targets[@]})) || targets=(mount)
if [[ $(id -u) -ne 0 ]]; then
  echo "test-nonroot: needs root (it makes a user and opens /dev/fuse); as an ordinary user," \
    "cargo test runs the mount tests as you" >&2
  exit 1
fi
for cmd in fusermount3 setpriv useradd; do
  command -v "$cmd" >/dev/null || { echo "test-nonroot: $cmd is missing (scripts/deps.sh)" >&2; exit 1; }
done
[[ -c /dev/fuse ]] || { echo "test-nonroot: no /dev/fuse (modprobe fuse)" >&2; exit 1; }

# The binaries under test (built already by `cargo test --workspace --release`: no rebuild).
args=()
for t in "${targets[@]}"; do args+=(--test "$t"); done
mapfile -t exes < <(cargo test --workspace --release --no-run --message-format=json "${args[@]}" |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"] + "\t" + m["executable"])')

user="vfnonroot$$"
dir=$(mktemp -d /tmp/veilfs-nonroot.XXXXXX)
fuse_mode=$(stat -c %a /dev/fuse)
cleanup() {
  set +e
  # The user's mounts left behind by a failed test, deepest first; then its processes.
  awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
    while read -r m; do umount -l "$m"; done
  if uid=$(id -u "$user" 2>/dev/null); then
    pkill -KILL -U "$uid"
    userdel "$user"
  fi
  umount -l "$dir" 2>/dev/null
  rm -rf "$dir"
  chmod "$fuse_mode" /dev/fuse
}
trap cleanup EXIT
useradd --no-create-home --user-group --shell /usr/sbin/nologin "$user"
uid=$(id -u "$user")
gid=$(id -g "$user")
# 4 GiB caps the data of two tests at a time (the largest ask for 2 GiB tmpfs each).
mount -t tmpfs -o size=4g,mode=0755 tmpfs "$dir"
mkdir "$dir/bin" "$dir/home" "$dir/tmp"
chown "$uid:$gid" "$dir/home" "$dir/tmp"
chmod 0700 "$dir/home" "$dir/tmp"
bins=()
for e in "${exes[@]}"; do
  name=${e%%$'\t'*}
  cp "${e#*$'\t'}" "$dir/bin/$name"
  [[ $name == veilfs ]] || bins+=("$name")
done
[[ -x $dir/bin/veilfs ]] || { echo "test-nonroot: cargo named no veilfs binary" >&2; exit 1; }
chmod 0666 /dev/fuse

# fsx's knobs (VEILFS_FSX_AS_USER=1, _SEED, _OPS) and VEILFS_LOG reach the tests; nothing else of root's.
pass=()
for v in $(compgen -e); do [[ $v == VEILFS_FSX_* || $v == VEILFS_LOG ]] && pass+=("$v=${!v}"); done
log="$dir/home/root-only.log"
start=$SECONDS
status=0
for b in "${bins[@]}"; do
  echo "test-nonroot: tests/$b.rs as $user (uid $uid), through fusermount3" >&2
  (cd "$dir/home" && setpriv --reuid="$uid" --regid="$gid" --init-groups \
    env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME="$dir/home" USER="$user" \
    TMPDIR="$dir/tmp" CI="${CI:-}" RUST_BACKTRACE=1 VEILFS_TEST_BIN="$dir/bin/veilfs" \
    VEILFS_ROOT_ONLY_LOG="$log" "${pass[@]}" "$dir/bin/$b" "$@") || status=$?
done
n=0
if [[ -s $log ]]; then
  n=$(sort -u "$log" | wc -l)
  echo "test-nonroot: $n test(s) need root and were not run as $user:" >&2
  sort -u "$log" | sed 's/^/  /' >&2
fi
echo "test-nonroot: ${bins[*]} as an ordinary user in $((SECONDS - start)) s ($n root-only)," \
  "exit $status" >&2
exit "$status"
