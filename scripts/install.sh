#!/bin/sh
# Installs veilfs, its man pages and its shell completions under PREFIX (default /usr/local),
# and the mount(8) helper SBINDIR/mount.fuse.veilfs (a symlink to the binary).
#   scripts/install.sh                     install target/release/veilfs (built if missing)
#   PREFIX=$HOME/.local scripts/install.sh
#   DESTDIR=/tmp/pkg scripts/install.sh    stage into a package root
#   scripts/install.sh --uninstall         remove what an install put there
# VEILFS_BIN=path/to/veilfs installs that binary instead of target/release/veilfs.
# SBINDIR: where the helper goes (mount(8) looks in /sbin). Default: /usr/sbin with DESTDIR
# (a package), /sbin for a system-wide install by root (PREFIX /usr or /usr/local), none
# otherwise (mount.fuse3 then runs veilfs from PATH). SBINDIR= (empty): no helper.
set -eu

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
root="$DESTDIR$PREFIX"
bindir="$root/bin"
mandir="$root/share/man/man1"
bashdir="$root/share/bash-completion/completions"
zshdir="$root/share/zsh/site-functions"
fishdir="$root/share/fish/vendor_completions.d"
if [ -z "${SBINDIR+set}" ]; then
    if [ -n "$DESTDIR" ]; then SBINDIR=/usr/sbin
    elif [ "$(id -u)" = 0 ] && { [ "$PREFIX" = /usr ] || [ "$PREFIX" = /usr/local ]; }; then SBINDIR=/sbin
    else SBINDIR=
    fi
fi
helper=${SBINDIR:+$DESTDIR$SBINDIR/mount.fuse.veilfs}

# The helper is this install's only when it links to this install's binary: the Debian
# package's /usr/sbin/mount.fuse.veilfs (the same file as /sbin/... on a merged /usr) links to
# /usr/bin/veilfs and belongs to dpkg.
ours() { [ -L "$1" ] && [ "$(readlink "$1")" = "$PREFIX/bin/veilfs" ]; }

if [ "${1:-}" = "--uninstall" ]; then
    rm -f "$bindir/veilfs" "$mandir"/veilfs.1 "$mandir"/veilfs-*.1 \
        "$bashdir/veilfs" "$zshdir/_veilfs" "$fishdir/veilfs.fish"
    if [ -n "$helper" ] && ours "$helper"; then
        rm -f "$helper"
    fi
    echo "veilfs: removed from $root"
    exit 0
fi

# One install story at a time: a system-wide install beside the Debian package would put a
# second veilfs first in PATH and take over the package's mount helper.
if [ -z "$DESTDIR" ] && [ -n "$helper" ] && [ -e "$helper" ] && ! ours "$helper"; then
    echo "veilfs: $helper belongs to another install ($(readlink "$helper" 2>/dev/null || echo 'not a link'));" \
        "remove that first (the package: sudo dpkg -r veilfs), or install without the helper: SBINDIR= $0" >&2
    exit 1
fi

here=$(cd "$(dirname "$0")/.." && pwd)
bin=${VEILFS_BIN:-$here/target/release/veilfs}
if [ ! -x "$bin" ]; then
    echo "veilfs: building $bin (cargo build --release)" >&2
    (cd "$here" && cargo build --release)
fi

install -d "$bindir" "$mandir" "$bashdir" "$zshdir" "$fishdir"
# Installed without debug information (the release build keeps it for profiling).
install -m 0755 "$bin" "$bindir/veilfs"
strip --strip-debug "$bindir/veilfs" 2>/dev/null || true
if [ -n "$helper" ]; then
    # mount -t fuse.veilfs and fstab lines run /sbin/mount.fuse.veilfs; veilfs knows the name.
    install -d "$(dirname "$helper")"
    ln -sf "$PREFIX/bin/veilfs" "$helper"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" generate man "$tmp"
install -m 0644 "$tmp"/*.1 "$mandir/"
"$bin" generate completions bash > "$tmp/veilfs.bash"
"$bin" generate completions zsh > "$tmp/_veilfs"
"$bin" generate completions fish > "$tmp/veilfs.fish"
install -m 0644 "$tmp/veilfs.bash" "$bashdir/veilfs"
install -m 0644 "$tmp/_veilfs" "$zshdir/_veilfs"
install -m 0644 "$tmp/veilfs.fish" "$fishdir/veilfs.fish"
echo "veilfs: installed into $root (binary, $(ls "$tmp"/*.1 | wc -l) man pages, bash/zsh/fish completions)${helper:+, mount helper $helper}"
