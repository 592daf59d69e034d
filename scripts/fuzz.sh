#!/usr/bin/env bash
# Fuzzes veilfs-core's parsers and decoders with cargo-fuzz (targets in fuzz/; see
# fuzz/README.md). Every build and run is niced: the test machine has 2 cores.
#
#   scripts/fuzz.sh --quick [TARGET...]        each target for VEILFS_FUZZ_SECONDS (default 5) s;
#                                              exits non-zero on any crash, hang or OOM
#   scripts/fuzz.sh --long MINUTES [TARGET...] each target for MINUTES of CPU time, one after
#                                              another; the corpus grows in fuzz/target/corpus/
#                                              (kept between runs); prints a table of CPU time,
#                                              executions, corpus size and findings
#   scripts/fuzz.sh --build                    only build the targets
#
# Crashing inputs land in fuzz/artifacts/TARGET/; replay one with
#   fuzz/target/x86_64-unknown-linux-gnu/release/TARGET fuzz/artifacts/TARGET/crash-…
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

ALL=(config entry_name header block xattr recovery_key symlink_target exchange_record stash_records lock_holder slots)
mode="${1:-}"
shift || true
minutes=""
if [[ "$mode" == "--long" ]]; then
  minutes="${1:?usage: scripts/fuzz.sh --long MINUTES [TARGET...]}"
  shift
fi
case "$mode" in
  --quick | --long | --build) ;;
  *)
    sed -n '2,15p' "$0" >&2
    exit 2
    ;;
esac
targets=("$@")
((${#targets[@]})) || targets=("${ALL[@]}")

# Release (-O) with debug assertions and overflow checks (-a). No sanitizer: the code under
# test is safe Rust (fuzz/README.md says why ASan is left out).
build_flags=(-O -a --sanitizer none)
bin_dir=target/x86_64-unknown-linux-gnu/release
# Inputs bigger than any real object of a target only slow the fuzzer down.
max_len() {
  case "$1" in
    config | slots) echo 16384 ;;
    stash_records) echo 65536 ;;
    block) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

start=$SECONDS
mkdir -p target
# `cargo fuzz build` takes one target or none (= all).
build_args=()
((${#targets[@]} == 1)) && build_args=("${targets[0]}")
if ! nice -n 19 cargo +nightly fuzz build "${build_flags[@]}" "${build_args[@]}" >target/build.log 2>&1; then
  grep -Ev '^\s*(Compiling|Downloaded|Downloading)' target/build.log >&2
  echo "fuzz: the build failed" >&2
  exit 1
fi
for t in "${targets[@]}"; do
  [[ -x "$bin_dir/$t" ]] || {
    echo "fuzz: target $t did not build" >&2
    exit 1
  }
done
echo "fuzz: built ${#targets[@]} targets in $((SECONDS - start)) s" >&2
[[ "$mode" == "--build" ]] && exit 0

common=(-rss_limit_mb=2048 -timeout=10 -print_final_stats=1)
failed=()
if [[ "$mode" == "--quick" ]]; then
  secs="${VEILFS_FUZZ_SECONDS:-5}"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  for t in "${targets[@]}"; do
    mkdir -p "$work/$t" "artifacts/$t"
    # The first directory takes new inputs; the committed seeds are only read.
    if nice -n 19 "$bin_dir/$t" "$work/$t" "corpus/$t" "${common[@]}" -max_total_time="$secs" \
      -max_len="$(max_len "$t")" -artifact_prefix="artifacts/$t/" >"$work/$t.log" 2>&1; then
      execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | grep -o '[0-9]*$' || echo '?')
      echo "fuzz: $t ok (${secs} s, $execs executions)" >&2
    else
      echo "fuzz: $t FAILED:" >&2
      grep -A4 'panicked at' "$work/$t.log" >&2 || true
      grep -v '^ *\(at \|[0-9]*: \)' "$work/$t.log" | tail -n 12 >&2
      failed+=("$t")
    fi
  done
  echo "fuzz: quick run took $((SECONDS - start)) s" >&2
else
  report="target/long-report.tsv"
  printf 'target\tcpu_min\twall_min\texecs\tcorpus_files\tcorpus_kib\tpeak_rss_mb\tresult\n' >"$report"
  for t in "${targets[@]}"; do
    mkdir -p "target/corpus/$t" "artifacts/$t"
    t0=$SECONDS
    cpu_s=0 execs=0 rss=0 rc=0 round=0
    # MINUTES is CPU time: on a shared machine a niced run gets less than a core, so run in
    # rounds (the corpus carries over) until the target has had its CPU minutes.
    while ((rc == 0 && cpu_s < minutes * 60)); do
      round=$((round + 1))
      log="target/long-$t.$round.log"
      TIMEFORMAT='%U %S'
      set +e
      { time nice -n 19 "$bin_dir/$t" "target/corpus/$t" "corpus/$t" "${common[@]}" \
        -max_total_time=$((minutes * 60 - cpu_s)) -max_len="$(max_len "$t")" \
        -artifact_prefix="artifacts/$t/" >"$log" 2>&1; } 2>"target/long-$t.time"
      rc=$?
      set -e
      read -r u s <"target/long-$t.time"
      cpu_s=$((cpu_s + $(awk -v u="$u" -v s="$s" 'BEGIN { printf "%d", u + s + 0.5 }')))
      e=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
      r=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
      execs=$((execs + e))
      if ((r > rss)); then rss=$r; fi
    done
    cpu=$(awk -v c="$cpu_s" 'BEGIN { printf "%.1f", c / 60 }')
    wall=$(awk -v w="$((SECONDS - t0))" 'BEGIN { printf "%.1f", w / 60 }')
    files=$(find "target/corpus/$t" -type f | wc -l)
    kib=$(du -sk "target/corpus/$t" | cut -f1)
    result=ok
    if ((rc != 0)); then
      result="FAILED(rc=$rc): $(grep -Eo 'ERROR: libFuzzer: [a-z-]+|panicked at [^,]*' "$log" | head -1)"
      failed+=("$t")
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$cpu" "$wall" "$execs" "$files" "$kib" "$rss" "$result" | tee -a "$report"
  done
  column -t -s $'\t' "$report" >&2 || cat "$report" >&2
fi
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
