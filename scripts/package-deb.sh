#!/usr/bin/env bash
# Builds a Debian package of veilfs with dpkg-deb (no cargo-deb needed):
#   scripts/package-deb.sh [OUTDIR]        (default target/debian; prints the .deb's path)
# It holds /usr/bin/veilfs (stripped), the mount(8) helper /usr/sbin/mount.fuse.veilfs (a
# link to it), man pages (veilfs(1), veilfs-SUBCOMMAND(1), mount.fuse.veilfs(8)), bash, zsh
# and fish completions, the systemd user unit veilfs@.service and the examples of
# contrib/systemd. Depends on fuse3 (fusermount3, /dev/fuse set-up).
# VEILFS_BIN=path/to/veilfs packages that binary instead of a fresh release build;
# DEB_COMPRESSION=none|gzip|xz (default xz).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/target/debian}
bin=${VEILFS_BIN:-}
if [[ -z "$bin" ]]; then
  (cd "$here" && cargo build --release --locked)
  bin=$here/target/release/veilfs
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/veilfs_${version}_$arch
mkdir -p "$root/DEBIAN"

# Binary, helper, man pages, completions: the same steps as a manual install.
cp "$bin" "$stage/veilfs"
strip --strip-debug "$stage/veilfs" 2>/dev/null || true
DESTDIR=$root PREFIX=/usr SBINDIR=/usr/sbin VEILFS_BIN=$stage/veilfs sh "$here/scripts/install.sh" >/dev/null
# Debian's places: zsh vendor completions, compressed man pages.
mkdir -p "$root/usr/share/zsh/vendor-completions"
mv "$root/usr/share/zsh/site-functions/_veilfs" "$root/usr/share/zsh/vendor-completions/"
rmdir "$root/usr/share/zsh/site-functions"
mkdir -p "$root/usr/share/man/man8"
echo ".so man1/veilfs-mount.1" > "$root/usr/share/man/man8/mount.fuse.veilfs.8"
gzip -9n "$root"/usr/share/man/man1/*.1 "$root/usr/share/man/man8/mount.fuse.veilfs.8"

# systemd: the user unit where `systemctl --user` finds it; everything as examples.
install -D -m 0644 "$here/contrib/systemd/veilfs@.service" "$root/usr/lib/systemd/user/veilfs@.service"
doc=$root/usr/share/doc/veilfs
install -d "$doc/examples/systemd"
install -m 0644 "$here"/contrib/systemd/* "$doc/examples/systemd/"
install -m 0644 "$here/README.md" "$doc/README.md"
cat > "$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: veilfs

Files: *
License: MIT or Apache-2.0
EOF

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<EOF
Package: veilfs
Version: $version
Architecture: $arch
Maintainer: veilfs developers <veilfs@localhost>
Installed-Size: $size
Depends: fuse3, libc6
Suggests: systemd
Section: utils
Priority: optional
Description: encrypted overlay filesystem (FUSE) with offline tools
 veilfs keeps an encrypted directory (CIPHERDIR) and mounts a plaintext view of it.
 Every file is encrypted on its own, names included, with authenticated integrity;
 the ciphertext can be synced and backed up like any folder. Offline tools import,
 export, list and read vaults without mounting. Mounts work from the command line,
 fstab (type fuse.veilfs) and systemd units, as root or as an ordinary user.
EOF
# A manual install (scripts/install.sh) of the mount helper would be replaced without a word:
# refuse, and say how to remove it.
cat > "$root/DEBIAN/preinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = install ]; then
    for h in /usr/sbin/mount.fuse.veilfs /sbin/mount.fuse.veilfs; do
        if [ -L "$h" ] && [ "$(readlink "$h")" != /usr/bin/veilfs ]; then
            echo "veilfs: $h links to $(readlink "$h"), a manual install (scripts/install.sh);" \
                "remove it first: sudo scripts/install.sh --uninstall" >&2
            exit 1
        fi
    done
fi
EOF
chmod 0755 "$root/DEBIAN/preinst"
find "$root" -type d -exec chmod 0755 {} +

mkdir -p "$out"
deb=$out/veilfs_${version}_$arch.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESSION:-xz}" --build "$root" "$deb" >/dev/null
echo "$deb"
