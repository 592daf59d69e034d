#!/usr/bin/env bash
# Installs the system packages veilfs needs to build, test and benchmark, when missing.
# Usage: scripts/deps.sh [--bench] [--fuzz]
#   --bench  also the peer filesystems and tools of bench/
#   --fuzz   also the fuzzing tools of scripts/fuzz.sh: a nightly toolchain and cargo-fuzz
#            (the test suite needs them; building and using veilfs does not)
set -euo pipefail
bench=false
fuzz=false
for arg in "$@"; do
  case "$arg" in
    --bench) bench=true ;;
    --fuzz) fuzz=true ;;
    *) echo "usage: scripts/deps.sh [--bench] [--fuzz]" >&2; exit 2 ;;
  esac
done
need=(fuse3 rsync attr python3 python3-matplotlib stress-ng util-linux man-db)
# The vault between two machines (tests/sync.rs): a real sync client, and a network file
# system — sshfs, served over loopback by OpenSSH's sftp-server alone (no sshd is started).
need+=(syncthing sshfs openssh-sftp-server)
if $bench; then
  need+=(gocryptfs encfs cryfs securefs fio stress-ng linux-source-6.1 python3-matplotlib e2fsprogs fscryptctl)
fi
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "veilfs: missing packages: ${missing[*]} (run as root or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "veilfs: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [[ ! -e /dev/fuse ]]; then
  modprobe fuse 2>/dev/null || true
fi
# The fuzz targets (scripts/fuzz.sh, run by scripts/test.sh) need nightly and cargo-fuzz.
if ! $fuzz; then
  exit 0
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "veilfs: installing the nightly Rust toolchain (for cargo fuzz)" >&2
  rustup toolchain install nightly --profile minimal >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "veilfs: installing cargo-fuzz" >&2
  nice -n 19 cargo install cargo-fuzz --locked --quiet
fi
