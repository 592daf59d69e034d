#!/usr/bin/env bash
# One command from a fresh machine to a working vault: installs what is missing, builds
# veilfs in release mode, creates ./demo/cipher (password "demo"), puts sample files in,
# mounts it at ./demo/plain (when FUSE is available) and shows plaintext and ciphertext
# side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo build --release --quiet
V=target/release/veilfs
D=demo
if grep -qs " $PWD/$D/plain " /proc/mounts; then $V umount "$D/plain" || fusermount3 -uz "$D/plain"; fi
rm -rf "$D" && mkdir -p "$D/samples/letters"
(umask 077; printf 'demo\n' > "$D/passfile")
echo "Dear diary, the launch code is 0000." > "$D/samples/diary.txt"
printf 'Quarterly numbers: %s\n' 1 2 3 > "$D/samples/letters/report for the board.txt"
head -c 300000 /dev/urandom > "$D/samples/photo.raw"
ln -s diary.txt "$D/samples/shortcut"

echo "== veilfs init: a vault in $D/cipher (password: demo)"
$V init "$D/cipher" --passfile "$D/passfile" --kdf-memory 64 > "$D/recovery-key.txt"
echo "   recovery key saved to $D/recovery-key.txt (normally you write it down)"
echo
echo "== veilfs import: encrypt $D/samples into the vault"
$V import "$D/samples/." "$D/cipher" --passfile "$D/passfile"
echo
echo "== what you see (veilfs ls -l -c: plaintext names, their ciphertext names)"
$V ls -l -c "$D/cipher" --passfile "$D/passfile"
echo
echo "== what is on disk (find $D/cipher): names and contents are encrypted"
find "$D/cipher" -printf '%10s  %P\n' | sort -k2
echo
echo "== veilfs cat diary.txt"
$V cat "$D/cipher/diary.txt" --passfile "$D/passfile"
echo
echo "== the same file on disk (first bytes)"
od -A d -t x1 "$D/cipher/$($V encrypt-path "$D/cipher" diary.txt --passfile "$D/passfile")" | head -3
echo
if [[ -e /dev/fuse ]] && mkdir -p "$D/plain" && $V mount "$D/cipher" "$D/plain" --passfile "$D/passfile"; then
  echo "== mounted: $D/plain is the plaintext view of $D/cipher"
  echo "hello from the mount" > "$D/plain/new-note.txt"
  echo "   wrote $D/plain/new-note.txt; each plaintext path and where it is stored:"
  (cd "$D/plain" && find . -mindepth 1 | sort | sed 's|^\./||') | while read -r f; do
    printf '   %-34s %s\n' "$f" "$($V encrypt-path "$D/cipher" "$f" --passfile "$D/passfile" | cut -c1-70)"
  done
  echo
  echo "Work in $D/plain like in any folder. Unmount with:  $V umount $D/plain   (or fusermount3 -u $D/plain)"
else
  echo "(no /dev/fuse here: the mount is skipped; the offline tools above work without it)"
fi
echo
echo "Try: $V export $D/cipher $D/out --passfile $D/passfile   (decrypt everything into $D/out)"
echo "     $V info $D/cipher"
echo "Remove the demo with: $V umount $D/plain; rm -rf $D"
