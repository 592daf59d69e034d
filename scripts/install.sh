#!/bin/sh
# Installs veilfs, its man pages and its shell completions under PREFIX (default /usr/local).
#   scripts/install.sh                     install target/release/veilfs (built if missing)
#   PREFIX=$HOME/.local scripts/install.sh
#   DESTDIR=/tmp/pkg scripts/install.sh    stage into a package root
#   scripts/install.sh --uninstall         remove what an install put there
# VEILFS_BIN=path/to/veilfs installs that binary instead of target/release/veilfs.
set -eu

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
root="$DESTDIR$PREFIX"
bindir="$root/bin"
mandir="$root/share/man/man1"
bashdir="$root/share/bash-completion/completions"
zshdir="$root/share/zsh/site-functions"
fishdir="$root/share/fish/vendor_completions.d"

if [ "${1:-}" = "--uninstall" ]; then
    rm -f "$bindir/veilfs" "$mandir"/veilfs.1 "$mandir"/veilfs-*.1 \
        "$bashdir/veilfs" "$zshdir/_veilfs" "$fishdir/veilfs.fish"
    echo "veilfs: removed from $root"
    exit 0
fi

here=$(cd "$(dirname "$0")/.." && pwd)
bin=${VEILFS_BIN:-$here/target/release/veilfs}
if [ ! -x "$bin" ]; then
    echo "veilfs: building $bin (cargo build --release)" >&2
    (cd "$here" && cargo build --release)
fi

install -d "$bindir" "$mandir" "$bashdir" "$zshdir" "$fishdir"
install -m 0755 "$bin" "$bindir/veilfs"
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
echo "veilfs: installed into $root (binary, $(ls "$tmp"/*.1 | wc -l) man pages, bash/zsh/fish completions)"
