"""Turning raw runs into medians, Markdown tables and a chart.

Every number in a table is a median over repetitions, shown with its min-max
range so noise is visible.  Ratios are normalised so that **>1 always means
better than the reference** (faster, fewer seconds, less space, less CPU,
less memory) -- the direction of EncFS's "advantage" column, applied to every
metric regardless of its unit.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .workloads import PEAK_RSS, Metric


# ------------------------------------------------------------------ summary

def summarize(runs: list[dict], backings, filesystems, metrics: list[Metric]) -> dict:
    """summary[backing][fs][metric] = {median,min,max,n,values} | {error} | {na}, over the
    runs that were kept (``kept_runs``)."""
    runs = kept_runs(runs)
    out: dict = {}
    for b in backings:
        out[b] = {}
        for fs in filesystems:
            mine = [r for r in runs if r["backing"] == b and r["fs"] == fs]
            out[b][fs] = {m.name: _cell(mine, m) for m in metrics}
    return out


def kept_runs(runs: list[dict]) -> list[dict]:
    """The runs that count: not those discarded and run again (``--retry-stolen``)."""
    return [r for r in runs if not r.get("discarded")]


#: A step that lost this share (%) of all CPU time to the hypervisor is pointed out.
STOLEN_NOTE = 10.0


def stolen_at_median(cell: dict) -> float | None:
    """The stolen share (%) of the repetition(s) that gave *cell*'s median (the larger of
    the two middle ones for an even count), or None if not recorded."""
    stolen = cell.get("stolen")
    if not stolen:
        return None
    order = sorted(range(len(cell["values"])), key=lambda i: cell["values"][i])
    n = len(order)
    middle = order[n // 2:n // 2 + 1] if n % 2 else order[n // 2 - 1:n // 2 + 1]
    known = [stolen[i] for i in middle if stolen[i] is not None]
    return max(known) if known else None


def summarize_doc(doc: dict) -> dict:
    """summarize() for a results.json document (used by ``--render``)."""
    return {b: summarize(doc["runs"], [b], doc["filesystems"],
                         [Metric(**m) for m in doc["metrics"][b]])[b]
            for b in doc["backings"]}


def _cell(runs: list[dict], metric: Metric) -> dict:
    if metric.name == PEAK_RSS.name:
        values = _peak_rss_per_rep(runs)
    else:
        values = [r["values"][metric.name] for r in runs if metric.name in r["values"]]
    failed = [r["errors"][metric.name] for r in runs if metric.name in r.get("errors", {})]
    if values:
        cell = {"median": statistics.median(values), "min": min(values), "max": max(values),
                "n": len(values), "values": values}
        stolen = [r.get("stolen_pct", {}).get(metric.name) for r in runs if metric.name in r["values"]]
        if metric.name != PEAK_RSS.name and any(x is not None for x in stolen):
            cell["stolen"] = stolen
        if failed:
            # Some repetitions failed: the median is over the others, and the
            # failure must stay visible next to it.
            cell["failed"] = len(failed)
            cell["error"] = failed[0]
        return cell
    for key in ("na", "errors"):
        reasons = [r[key][metric.name] for r in runs if metric.name in r.get(key, {})]
        if reasons:
            return {"na": reasons[0]} if key == "na" else {"error": reasons[0]}
    return {"error": "not measured"}


def _peak_rss_per_rep(runs: list[dict]) -> list[float]:
    """The daemon's peak RSS is a property of a whole run, not of one group:
    take the maximum over the groups of each repetition."""
    per_rep: dict = {}
    for r in runs:
        if "peak_rss" in r["values"]:
            per_rep[r["rep"]] = max(per_rep.get(r["rep"], 0.0), r["values"]["peak_rss"])
    return list(per_rep.values())


def ratio(cell: dict, ref: dict, metric: Metric) -> float | None:
    """How much better *cell* is than *ref* (>1 = better), or None."""
    a, b = cell.get("median"), ref.get("median")
    if a is None or b is None or a <= 0 or b <= 0:
        return None
    return a / b if metric.higher_is_better else b / a


# ------------------------------------------------------------------ markdown

def fmt(x: float) -> str:
    if x == 0:
        return "0"
    digits = max(0, 2 - int(math.floor(math.log10(abs(x)))))
    return f"{x:,.{min(digits, 3)}f}"


def _value_cell(cell: dict, notes: dict) -> str:
    if "median" in cell:
        text = fmt(cell["median"])
        if cell["n"] > 1 and cell["min"] != cell["max"]:
            text += f" ({fmt(cell['min'])}–{fmt(cell['max'])})"
        if cell.get("failed"):
            total = cell["n"] + cell["failed"]
            text += f" ⚠ {cell['failed']}/{total} failed [{_note(notes, cell['error'])}]"
        return text
    if "na" in cell:
        return "n/a"
    return f"error [{_note(notes, cell['error'])}]"


def _note(notes: dict, text: str) -> str:
    if text not in notes:
        notes[text] = f"e{len(notes) + 1}"
    return notes[text]


def markdown(summary: dict, metrics: list[Metric], filesystems: list[str],
             titles: dict, header: str) -> str:
    lines = [header, ""]
    for backing, per_fs in summary.items():
        notes: dict = {}
        lines += [f"## Backing store: {backing}", ""]
        lines += _table_values(per_fs, metrics, filesystems, notes)
        for ref in ("plain", "fuse-floor", "gocryptfs"):
            if ref in per_fs and ref in filesystems:
                lines += _table_ratios(per_fs, metrics, filesystems, ref)
        if notes:
            lines += ["Errors and unavailable filesystems:", ""]
            lines += [f"- **[{tag}]** {_escape(text)}" for text, tag in notes.items()]
            lines.append("")
    lines += ["Filesystems:", ""]
    lines += [f"- **{fs}**: {_escape(titles.get(fs, ''))}" for fs in filesystems]
    return "\n".join(lines) + "\n"


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def _table_values(per_fs, metrics, filesystems, notes) -> list[str]:
    out = ["Median of the runs (min–max in brackets).", "",
           _row(["workload", "unit", *filesystems]),
           _row(["---", "---", *(["---:"] * len(filesystems))])]
    for m in metrics:
        arrow = "↑" if m.higher_is_better else "↓"
        cells = [_value_cell(per_fs[fs][m.name], notes) for fs in filesystems]
        out.append(_row([f"{m.label}", f"{m.unit} {arrow}", *cells]))
    return out + ["", "↑ = higher is better, ↓ = lower is better.", ""]


def _table_ratios(per_fs, metrics, filesystems, ref) -> list[str]:
    out = [f"Relative to **{ref}**: >1 = better than {ref} (faster, smaller, less CPU/memory), "
           f"<1 = worse.", "",
           _row(["workload", *filesystems]),
           _row(["---", *(["---:"] * len(filesystems))])]
    for m in metrics:
        cells = []
        for fs in filesystems:
            r = ratio(per_fs[fs][m.name], per_fs[ref][m.name], m)
            cells.append("–" if r is None else f"{r:.2f}")
        out.append(_row([m.label, *cells]))
    return out + [""]


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# ------------------------------------------------------------------ files

def write_outputs(doc: dict, out: Path, log) -> None:
    """results.md and chart.png from a results.json document."""
    filesystems = doc["filesystems"]
    titles = {k: v["title"] for k, v in doc["fs_info"].items()}
    metrics = {b: [Metric(**m) for m in doc["metrics"][b]] for b in doc["backings"]}
    parts = []
    for b in doc["backings"]:
        header = markdown_header(doc) if not parts else ""
        parts.append(markdown({b: doc["summary"][b]}, metrics[b], filesystems, titles,
                              header).strip())
    (out / "results.md").write_text("\n\n".join(parts) + "\n")
    first = metrics[doc["backings"][0]]
    summary = {b: {fs: {m.name: doc["summary"][b][fs].get(m.name, {"na": "not run"})
                        for m in first} for fs in filesystems} for b in doc["backings"]}
    try:
        chart(summary, first, filesystems, out / "chart.png", doc.get("title", "veilbench"))
    except ImportError as exc:
        log(f"no chart: {exc}")


def markdown_header(doc: dict) -> str:
    m = doc.get("machine", {})
    lines = [f"# {doc.get('title', 'veilbench results')}", "",
             f"`{doc['command']}` — {doc['created']}"
             + ("" if doc["finished"] else f" — **incomplete run** ({doc['interrupted']})"), "",
             f"Machine: {m.get('cpu')} × {m.get('cpus')} CPUs, {m.get('memory_gib')} GiB RAM, "
             f"kernel {m.get('kernel')}, {m.get('os')}; disk backing: {m.get('disk_fs')}"
             + (f"; cpuidle {m['cpuidle']}" if m.get("cpuidle") else "")
             + (f", guest halt polling {m['guest_halt_poll_ns']} ns" if m.get("guest_halt_poll_ns") else "")
             + ".", ""]
    versions = [f"{fs} {i['version']}".strip() for fs, i in doc["fs_info"].items()
                if i["available"] and i["version"]]
    if versions:
        lines += ["Versions: " + "; ".join(versions) + ".", ""]
    tree = doc.get("datasets", {}).get("kernel_tree", {}).get("description")
    if tree:
        lines += [f"Kernel tree: {tree}.", ""]
    loads = [r["loadavg_1min"] for r in doc["runs"] if "loadavg_1min" in r]
    if loads:
        lines += [f"1-minute load average during the runs: median {statistics.median(loads):.1f}, "
                  f"range {min(loads):.1f}–{max(loads):.1f} ({m.get('cpus')} CPUs).", ""]
    steal = [r["steal_pct"] for r in doc["runs"] if "steal_pct" in r]
    wake = [r["wakeup_us"] for r in doc["runs"] if "wakeup_us" in r]
    if steal and wake:
        lines += [f"Host contention: CPU time taken by the hypervisor per run median {statistics.median(steal):.1f} %, "
                  f"max {max(steal):.1f} %; a one-byte pipe round trip between two processes (what each FUSE "
                  f"request costs at least) median {statistics.median(wake):.1f} µs, range "
                  f"{min(wake):.1f}–{max(wake):.1f} µs.", ""]
    steps = [x for r in kept_runs(doc["runs"]) for x in r.get("stolen_pct", {}).values()]
    if steps:
        lines += [f"Timed steps that lost ≥ {STOLEN_NOTE:g} % of all CPU time to the hypervisor: "
                  f"{sum(x >= STOLEN_NOTE for x in steps)} of {len(steps)} (worst {max(steps):.1f} %).", ""]
    dropped = [r for r in doc["runs"] if r.get("discarded")]
    if dropped:
        lines += [f"Runs discarded and run again because a timed step lost ≥ {STOLEN_NOTE:g} % to the "
                  f"hypervisor (kept in results.json, not in the medians): {len(dropped)} — "
                  + "; ".join(f"{r['fs']} {r['group']} rep {r['rep'] + 1} ({r['discarded']})" for r in dropped)
                  + ".", ""]
    for b, p in doc["plan"].items():
        reps = sorted(set(p["reps"].values()))
        lines.append(f"- {b}: groups {', '.join(p['groups'])}; repetitions "
                     + "/".join(map(str, reps)))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ chart

def chart(summary: dict, metrics: list[Metric], filesystems: list[str], path: Path,
          title: str) -> None:
    """One heatmap per backing store: rows are workloads, columns
    filesystems, colour is the speed relative to plain on a log scale (green
    = better than plain, red = worse), and each cell is labelled with the
    ratio and the absolute median, so the chart stands on its own."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    backings = list(summary)
    ncols = len(filesystems)
    fig_w = 3.5 + 1.0 * ncols * len(backings)
    fig_h = 1.6 + 0.42 * len(metrics)
    fig, axes = plt.subplots(1, len(backings), figsize=(fig_w, fig_h), squeeze=False,
                             layout="constrained")
    cmap = matplotlib.colormaps["RdYlGn"].copy()
    cmap.set_bad("#d9d9d9")
    norm = TwoSlopeNorm(vmin=-3, vcenter=0, vmax=3)
    for ax, backing in zip(axes[0], backings):
        grid, texts = _heat(summary[backing], metrics, filesystems)
        image = ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto")
        for (i, j), text in texts.items():
            dark = abs(grid[i, j]) > 2.0 if grid[i, j] == grid[i, j] else False
            ax.text(j, i, text, ha="center", va="center", fontsize=6.5,
                    color="white" if dark else "black")
        ax.set_xticks(range(ncols), filesystems, rotation=30, ha="right", fontsize=8)
        first = ax is axes[0][0]
        ax.set_yticks(range(len(metrics)),
                      [_row_label(summary[backing], m) for m in metrics] if first else [],
                      fontsize=7.5)
        ax.set_title(f"backing: {backing}", fontsize=10)
    bar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.6, pad=0.02)
    bar.set_ticks([-3, -2, -1, 0, 1, 2, 3], labels=["⅛×", "¼×", "½×", "1×", "2×", "4×", "8×"])
    bar.set_label("relative to plain (>1× = better than plain; grey = error / n/a; "
                  "⚠ = some repetitions failed)", fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


CHART_REFERENCES = ("plain", "fuse-floor", "gocryptfs")


def chart_reference(per_fs, metric: Metric) -> str | None:
    """The row's colour reference: plain, or for daemon-only metrics (CPU,
    RSS), where plain has no value, the first FUSE filesystem that has one."""
    for ref in CHART_REFERENCES:
        if "median" in per_fs.get(ref, {}).get(metric.name, {}):
            return ref
    return None


def _row_label(per_fs, m: Metric) -> str:
    ref = chart_reference(per_fs, m)
    arrow = "↑" if m.higher_is_better else "↓"
    vs = f", vs {ref}" if ref and ref != "plain" else ""
    return f"{m.label} [{m.unit} {arrow}{vs}]"


def _heat(per_fs, metrics, filesystems):
    import numpy as np
    grid = np.full((len(metrics), len(filesystems)), np.nan)
    texts = {}
    for i, m in enumerate(metrics):
        ref = chart_reference(per_fs, m)
        for j, fs in enumerate(filesystems):
            cell = per_fs[fs][m.name]
            if "median" not in cell:
                texts[(i, j)] = "n/a" if "na" in cell else "error"
                continue
            r = ratio(cell, per_fs[ref][m.name], m) if ref else None
            if r is not None:
                grid[i, j] = max(-3.0, min(3.0, math.log2(r)))
                texts[(i, j)] = f"{r:.2f}×\n{fmt(cell['median'])}"
            else:
                texts[(i, j)] = fmt(cell["median"])
            if cell.get("failed"):
                texts[(i, j)] += f"\n⚠ {cell['failed']} failed"
    return grid, texts
