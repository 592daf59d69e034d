#!/usr/bin/env python3
"""Prints veilfs's performance targets (issue 5) as met / not met from a run.

    bench/targets.py RESULTS_DIR [--backing tmpfs]

Reads RESULTS_DIR/results.json (written by bench/run) and prints a Markdown table:
for every workload, veilfs's median, its ratio to gocryptfs (>1 = veilfs better), its
cost relative to the FUSE floor (veilfs time / floor time, or floor rate / veilfs rate;
<= 1.3 is the target) and its ratio to plain, followed by the scalar targets (du, build,
4 KiB writes, two writers, peak RSS). Needs plain, fuse-floor, veilfs and gocryptfs in the
run; rows whose inputs are missing say so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from veilbench.report import fmt as fmt_value, summarize_doc  # noqa: E402
from veilbench.workloads import Metric  # noqa: E402

# Workloads with the "2x gocryptfs and within 1.3x of the floor" targets: every time- or
# rate-based one (CPU, memory and size rows have their own targets below).
SPEED = ("stream_write", "stream_read", "bigfile_in", "bigfile_out", "extract", "rsync", "ls_lR",
         "md5sum", "delete", "many_in", "many_out", "mixed_in", "mixed_out", "md_create", "md_stat",
         "md_delete", "randread", "randwrite")


def median(per_fs: dict, fs: str, metric: str) -> float | None:
    cell = per_fs.get(fs, {}).get(metric)
    return cell.get("median") if cell else None


def better_ratio(m: Metric, a: float, b: float) -> float:
    """How many times better a is than b (>1 = a better)."""
    return a / b if m.higher_is_better else b / a


def fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--backing", default="tmpfs")
    a = p.parse_args(argv)
    doc = json.loads((a.results / "results.json").read_text())
    summary = summarize_doc(doc)
    if a.backing not in summary:
        print(f"targets: no {a.backing} backing in {a.results}", file=sys.stderr)
        return 2
    per_fs = summary[a.backing]
    metrics = {m["name"]: Metric(**m) for m in doc["metrics"][a.backing]}
    rows = ["| workload | veilfs | × gocryptfs (≥ 2) | cost vs fuse-floor (≤ 1.3) | × plain | fuse-floor × gocryptfs | met |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name in SPEED:
        m = metrics.get(name)
        v = median(per_fs, "veilfs", name)
        if m is None or v is None:
            continue
        g, f, pl = (median(per_fs, fs, name) for fs in ("gocryptfs", "fuse-floor", "plain"))
        vg = better_ratio(m, v, g) if g else None
        cost = 1 / better_ratio(m, v, f) if f else None
        vp = better_ratio(m, v, pl) if pl else None
        fg = better_ratio(m, f, g) if f and g else None
        goal = 3.0 if name == "randwrite" else 2.0
        met = []
        if vg is not None:
            met.append("gocryptfs ✓" if vg >= goal else "gocryptfs ✗")
        if cost is not None:
            met.append("floor ✓" if cost <= 1.3 else "floor ✗")
        label = f"{m.label} ({m.unit})"
        rows.append(f"| {label} | {fmt_value(v)} | {fmt(vg)} | {fmt(cost)} | {fmt(vp)} | {fmt(fg)} | {', '.join(met)} |")
    print("\n".join(rows))
    print()
    extra = []
    du_v, du_p = median(per_fs, "veilfs", "du"), median(per_fs, "plain", "du")
    if du_v and du_p:
        extra.append(f"- du of the extracted tree: {du_v / du_p:.3f}× plain (target ≤ 1.01)")
    b_v, b_p = median(per_fs, "veilfs", "build"), median(per_fs, "plain", "build")
    if b_v and b_p:
        extra.append(f"- build: {b_v / b_p:.3f}× plain's time (target ≤ 1.05)")
    sw_v, sw_p = median(per_fs, "veilfs", "stream_write"), median(per_fs, "plain", "stream_write")
    if sw_v and sw_p:
        extra.append(f"- 4 KiB sequential writes: {sw_v / sw_p:.2f}× plain (target ≥ 0.5)")
    sc = median(per_fs, "veilfs", "par_scaling")
    if sc:
        extra.append(f"- 2 writers on one file: {sc:.2f}× one writer (target ≥ 1.6)")
    rss = median(per_fs, "veilfs", "peak_rss")
    if rss:
        extra.append(f"- daemon peak RSS: {rss:.1f} MiB (target ≤ 100)")
    for name, unit in (("cpu_per_gib", "CPU-s per GiB streamed"), ("cpu_per_file", "CPU-ms per file created")):
        v, g = median(per_fs, "veilfs", name), median(per_fs, "gocryptfs", name)
        if v:
            extra.append(f"- daemon {unit}: {v:.3g}" + (f" (gocryptfs {g:.3g})" if g else ""))
    print("\n".join(extra))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
