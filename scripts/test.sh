#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, property, known-answer, tamper and
# integration tests (the mount tests need /dev/fuse, and root or /dev/fuse open to the user;
# under CI=true they fail instead of skipping when it is missing), the mount group once more
# as an ordinary user (scripts/test-nonroot.sh), then a short run of every fuzz target.
#
#   scripts/test.sh            the whole suite (what CI runs)
#   scripts/test.sh --quick    the inner loop, under 3 minutes on a built tree: formatting,
#                              lints, every crate's unit tests, the core crate's tests and a
#                              mount smoke test
#   scripts/test.sh ARGS...    the whole suite, ARGS passed to `cargo test` (a filter)
set -euo pipefail
cd "$(dirname "$0")/.."
# What a client remembers of each vault (its rollback memory) and the crash marks go to
# $XDG_STATE_HOME/veilfs: never the real home's while tests run. tests/common also points
# VEILFS_STATE_DIR into the build's directory for every veilfs it starts.
test_state=$(mktemp -d)
trap 'rm -rf "$test_state"' EXIT
export XDG_STATE_HOME=$test_state
if [[ "${1:-}" == "--quick" ]]; then
  bash scripts/deps.sh
  cargo fmt --all -- --check
  cargo clippy --workspace --all-targets --release -- -D warnings
  # Every cargo call here selects targets with --workspace, so features unify as in the whole
  # suite's build and its compiled tests are reused (`-p veilfs-core` alone would build the
  # core crate once more, with other features). One build step for all, so that cargo runs
  # the links in parallel; then the unit tests, the core's tests and two mount tests.
  quick=(--profile quick --workspace --lib --bins --test core --test fault_atomic --test mount)
  cargo test "${quick[@]}" --no-run
  cargo test --profile quick --workspace --lib --bins --test core --test fault_atomic
  cargo test --profile quick --workspace --test mount -- operations_behave_like_a_plain_directory \
    ciphertext_reveals_no_names_or_content_and_data_survives_remount
  echo "quick tier passed (the whole suite: scripts/test.sh)"
  exit 0
fi
bash scripts/deps.sh --fuzz
# The benchmark harness draws its chart with matplotlib: the Debian package serves the system
# Python; a python3 of its own (pyenv, a venv) first on PATH gets it from PyPI.
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
# The reference reader (tests/vectors/reference_reader.py) runs inside `tests/vectors.rs` too.
python3 -c 'import cryptography' 2>/dev/null || python3 -m pip install -q cryptography
# Run as root, in a throwaway view of the machine (scripts/sandbox.sh): the tests that make
# users, edit /etc/fstab or install the package change only that view, and two runs at once
# do not meet.
bash scripts/sandbox.sh cargo test --workspace --release "$@"
# The mount and POSIX test groups again as an ordinary user, through fusermount3 (as root only: it makes
# the user; run as a user, the cargo test above already mounted as one).
if [[ $(id -u) -eq 0 ]]; then
  bash scripts/sandbox.sh bash scripts/test-nonroot.sh mount posix
fi
# The crash matrix needs a build with crash points compiled in (tests/crash.rs):
# the daemon dies at every named point and at random moments under load. Its table (point,
# what was checked, result) and the count of points x runs are printed into the log.
# It builds in a target directory of its own, so the veilfs binary of target/release stays the
# one without crash points; the first time it starts from a copy of the normal build's
# dependencies instead of building them all again.
mkdir -p target/failpoints
(
  flock 9 # two runs at once copy it once
  if [[ ! -d target/failpoints/release && -d target/release ]]; then
    cp -a target/release "target/failpoints/release.$$" && mv "target/failpoints/release.$$" target/failpoints/release
  fi
) 9>target/failpoints/.seed.lock
CARGO_TARGET_DIR=target/failpoints cargo test --release --features failpoints --test crash -- --nocapture --test-threads=1
# A few seconds of each fuzz target (fuzz/README.md), seeded with the committed corpus;
# a crash, hang or OOM fails the suite.
bash scripts/fuzz.sh --quick
# The benchmark harness's own unit tests (no root, no mounts; the timed runs stay out of here).
python3 -m unittest discover -s bench/tests
# An independent Python reader (written from docs/FORMAT.md) must agree with the vectors.
python3 tests/vectors/reference_reader.py --vectors tests/vectors/v1.json
