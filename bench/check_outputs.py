#!/usr/bin/env python3
"""Check that a bench/run output directory is well-formed.

    bench/check_outputs.py DIR [--expect-fs plain,veilfs] [--expect-backing tmpfs]
                               [--expect-workloads stream,kernel]

Verifies structure, not timings: results.json parses and has the expected
schema; every (backing, filesystem, metric) that was planned has a summary
cell holding either a number or an error / n/a string (an unavailable
filesystem is a valid, reported outcome); results.md has one table per
backing with a row per metric and a column per filesystem; chart.png is a
real PNG.  Exit status 0 = well-formed, 1 = problems (listed on stderr).
Standard library only, so any test harness can call it.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path

SCHEMA = "veilbench/1"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_cell(cell, where: str, problems: list[str]) -> str:
    """Returns 'value', 'error' or 'na' and records what is malformed."""
    if not isinstance(cell, dict):
        problems.append(f"{where}: not an object")
        return "bad"
    if "median" in cell:
        if cell.get("failed") and not isinstance(cell.get("error"), str):
            problems.append(f"{where}: partial failure without an error string")
        nums = [cell.get(k) for k in ("median", "min", "max")]
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in nums):
            problems.append(f"{where}: median/min/max must be finite numbers: {cell}")
        elif not nums[1] <= nums[0] <= nums[2]:
            problems.append(f"{where}: min <= median <= max violated: {cell}")
        if not isinstance(cell.get("n"), int) or cell["n"] < 1:
            problems.append(f"{where}: n must be a positive integer")
        return "value"
    for key in ("error", "na"):
        if key in cell:
            if not isinstance(cell[key], str) or not cell[key].strip():
                problems.append(f"{where}: {key} must be a non-empty string")
            return key
    problems.append(f"{where}: neither a value nor an error")
    return "bad"


def check_json(doc: dict, expect: dict, problems: list[str]) -> tuple[dict, dict]:
    if doc.get("schema") != SCHEMA:
        problems.append(f"results.json: schema is {doc.get('schema')!r}, want {SCHEMA!r}")
    backings = doc.get("backings") or []
    filesystems = doc.get("filesystems") or []
    plan, metrics, summary = doc.get("plan", {}), doc.get("metrics", {}), doc.get("summary", {})
    if not backings or not filesystems:
        problems.append("results.json: empty backings or filesystems")
    for key, have in (("fs", filesystems), ("backing", backings)):
        missing = [x for x in expect.get(key, []) if x not in have]
        if missing:
            problems.append(f"results.json: requested {key} missing: {', '.join(missing)}")
    if not isinstance(doc.get("runs"), list):
        problems.append("results.json: runs must be a list")
    for i, r in enumerate(doc.get("runs") or []):
        for key in ("backing", "fs", "group", "rep", "values", "errors"):
            if key not in r:
                problems.append(f"results.json: runs[{i}] lacks {key!r}")
    counts = {"value": 0, "error": 0, "na": 0, "bad": 0}
    labels = {}
    for b in backings:
        groups = plan.get(b, {}).get("groups", [])
        missing = [g for g in expect.get("workloads", []) if g not in groups]
        if missing:
            problems.append(f"results.json: {b}: requested workloads missing: {', '.join(missing)}")
        group_metrics = [m for g in groups for m in doc.get("groups", {}).get(g, {}).get("metrics", [])]
        names = [m.get("name") for m in metrics.get(b, [])]
        if not names:
            problems.append(f"results.json: no metrics for backing {b}")
        for name in group_metrics:
            if name not in names:
                problems.append(f"results.json: {b}: metric {name} of a planned group not listed")
        labels[b] = [m.get("label") for m in metrics.get(b, [])]
        for fs in filesystems:
            for name in names:
                cell = summary.get(b, {}).get(fs, {}).get(name)
                counts[check_cell(cell, f"summary[{b}][{fs}][{name}]", problems)] += 1
    return counts, labels


def _tables(text: str) -> list[list[list[str]]]:
    """Markdown tables in *text*, each a list of rows of stripped cells."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


def check_markdown(text: str, labels: dict, filesystems: list[str], problems: list[str]) -> None:
    for b, names in labels.items():
        head = f"## Backing store: {b}"
        if head not in text:
            problems.append(f"results.md: no section {head!r}")
            continue
        section = text.split(head, 1)[1].split("\n## ", 1)[0]
        tables = _tables(section)
        for table in tables:
            width = len(table[0])
            for row in table[1:]:
                if len(row) != width:
                    problems.append(f"results.md: {b}: row with {len(row)} cells in a "
                                    f"{width}-column table: {' | '.join(row)[:60]!r}")
        values = next((t for t in tables if t[0][:2] == ["workload", "unit"]), None)
        if values is None:
            problems.append(f"results.md: {b}: no value table")
            continue
        missing_fs = [fs for fs in filesystems if fs not in values[0]]
        if missing_fs:
            problems.append(f"results.md: {b}: columns missing for {', '.join(missing_fs)}")
        row_labels = [row[0] for row in values[2:]]
        for label in names:
            if label not in row_labels:
                problems.append(f"results.md: {b}: no row for {label!r}")


def check_png(path: Path, problems: list[str]) -> None:
    data = path.read_bytes()[:32]
    if not data.startswith(PNG_SIGNATURE):
        problems.append("chart.png: bad PNG signature")
        return
    length, kind = struct.unpack(">I4s", data[8:16])
    width, height = struct.unpack(">II", data[16:24])
    if kind != b"IHDR" or length != 13 or width == 0 or height == 0:
        problems.append(f"chart.png: bad IHDR ({kind!r}, {width}x{height})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--expect-fs", default="")
    p.add_argument("--expect-backing", default="")
    p.add_argument("--expect-workloads", default="")
    args = p.parse_args(argv)
    expect = {k: [x for x in v.split(",") if x] for k, v in
              (("fs", args.expect_fs), ("backing", args.expect_backing),
               ("workloads", args.expect_workloads))}
    problems: list[str] = []
    files = {name: args.dir / name for name in ("results.json", "results.md", "chart.png")}
    for name, path in files.items():
        if not path.is_file() or path.stat().st_size == 0:
            problems.append(f"{name}: missing or empty in {args.dir}")
    counts = {}
    if files["results.json"].is_file():
        try:
            doc = json.loads(files["results.json"].read_text())
            counts, labels = check_json(doc, expect, problems)
            if files["results.md"].is_file():
                check_markdown(files["results.md"].read_text(), labels,
                               doc.get("filesystems") or [], problems)
        except (ValueError, AttributeError, TypeError) as exc:
            problems.append(f"results.json: unreadable: {exc}")
    if files["chart.png"].is_file():
        check_png(files["chart.png"], problems)
    if problems:
        for line in problems:
            print(f"check_outputs: {line}", file=sys.stderr)
        print(f"check_outputs: FAILED ({len(problems)} problems)")
        return 1
    print(f"check_outputs: OK ({counts.get('value', 0)} values, {counts.get('error', 0)} errors, "
          f"{counts.get('na', 0)} n/a)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
