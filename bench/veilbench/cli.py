"""``bench/run``: parse options, run the matrix, write the outputs.

The loop order is backing > repetition > group > filesystem, with the
filesystem order rotated every repetition (A B C, B C A, C A B).  Machine
drift (thermal, noisy neighbours, page-cache state) therefore hits every
filesystem alike instead of one filesystem's whole series.

Raw results are rewritten to ``results.json`` after every single run, so
even an interrupted run leaves usable data; tables and chart are produced
from whatever was measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import SCHEMA, backing as backing_mod, report
from .datasets import BUILD_PACKAGES, Datasets
from .filesystems import Ext4LoopFs, Filesystem, Secrets, ensure_installed, registry
from .mounts import force_unmount, is_mounted, mounts_under
from .proc import (Cleanup, Interrupted, StepError, cpu_times, ignore_signals,
                   install_signal_handlers, run, wakeup_round_trip_us, which)
from .progress import Progress
from .session import MountSession
from .workloads import GROUPS, GROUPS_BY_NAME, Context, Sizes, all_metrics

DEFAULT_FS = ["plain", "fuse-floor", "veilfs", "gocryptfs", "encfs", "cryfs", "securefs",
              "ext4-loop", "fscrypt"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    fs_names = list(registry())
    p = argparse.ArgumentParser(
        prog="bench/run",
        description="Benchmark veilfs against plain storage and peer encrypted filesystems.",
        epilog=f"filesystems: {', '.join(fs_names)}; "
               f"workload groups: {', '.join(g.name for g in GROUPS)}; backings: tmpfs, disk")
    p.add_argument("--fs", default=",".join(DEFAULT_FS),
                   help="comma-separated filesystems (default: all)")
    p.add_argument("--workloads", default=",".join(g.name for g in GROUPS),
                   help="comma-separated workload groups (default: all)")
    p.add_argument("--backing", default="tmpfs,disk", help="comma-separated backing stores: tmpfs, disk (default: tmpfs,disk)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per workload (default 3)")
    p.add_argument("--group-reps", default="",
                   help="per-group repetition override, e.g. build=1,kernel=2")
    p.add_argument("--disk-workloads", default=None,
                   help="workload groups for the disk backing (default: same as --workloads)")
    p.add_argument("--disk-reps", type=int, default=None,
                   help="repetitions on the disk backing (default: --reps)")
    p.add_argument("--retry-stolen", type=int, default=2, metavar="N",
                   help="run a repetition again, up to N times, when one of its timed steps lost "
                        f"≥ {report.STOLEN_NOTE:g} %% of all CPU time to the hypervisor; the discarded run "
                        "stays in results.json and is counted in the tables' header (default 2; quick: 0)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, 1 repetition: a smoke test (under 2 minutes)")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory")
    p.add_argument("--timeout", type=float, default=None,
                   help="per-step timeout in seconds (default 1200; quick: 90)")
    p.add_argument("--mount-timeout", type=float, default=120, help="seconds to wait for a mount")
    p.add_argument("--cache-dir", type=Path, default=Path("/var/tmp/veilbench-cache"),
                   help="where the kernel-tree tarball is cached")
    p.add_argument("--disk-dir", type=Path, default=Path("/var/tmp"),
                   help="parent directory of the disk backing")
    p.add_argument("--tmpfs-size", default=None, help="size cap of the backing tmpfs (default 8G)")
    p.add_argument("--no-install", action="store_true",
                   help="do not apt-get/pip install missing tools")
    p.add_argument("--title", default=None, help="title for the chart and tables")
    p.add_argument("--render", type=Path, metavar="DIR", default=None,
                   help="only re-render DIR/results.json into tables and chart (no benchmark)")
    args = p.parse_args(argv)
    args.fs = _split(args.fs, fs_names, "filesystem")
    args.workloads = _split(args.workloads, list(GROUPS_BY_NAME), "workload group")
    args.backing = _split(args.backing, list(backing_mod.BACKINGS), "backing")
    if args.disk_workloads is not None:
        args.disk_workloads = _split(args.disk_workloads, list(GROUPS_BY_NAME), "workload group")
    args.group_reps = _parse_group_reps(args.group_reps)
    if args.quick:
        args.reps = 1
        args.disk_reps = 1
        args.retry_stolen = 0
    if args.retry_stolen < 0:
        raise SystemExit("--retry-stolen must be 0 or more")
    args.timeout = args.timeout or (90 if args.quick else 1200)
    args.tmpfs_size = args.tmpfs_size or ("2G" if args.quick else "8G")
    return args


def _split(value: str, known: list[str], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in known]
    if unknown:
        raise SystemExit(f"unknown {what}(s): {', '.join(unknown)}; known: {', '.join(known)}")
    return items


def _parse_group_reps(value: str) -> dict:
    out = {}
    for item in filter(None, (v.strip() for v in value.split(","))):
        name, _, n = item.partition("=")
        if name not in GROUPS_BY_NAME or not n.isdigit():
            raise SystemExit(f"bad --group-reps item {item!r} (want GROUP=N)")
        out[name] = int(n)
    return out


# ------------------------------------------------------------------ plan

def make_plan(args) -> dict:
    """backing -> {"groups": [...], "reps": {group: n}} for this invocation."""
    plan = {}
    for b in args.backing:
        groups = args.workloads
        reps = args.reps
        if b == "disk":
            groups = args.disk_workloads if args.disk_workloads is not None else groups
            reps = args.disk_reps if args.disk_reps is not None else reps
        plan[b] = {"groups": list(groups),
                   "reps": {g: min(reps, args.group_reps.get(g, reps)) for g in groups}}
    return plan


def schedule(plan: dict, filesystems: list[str]):
    """(backing, rep, group, fs, position) in interleaved order."""
    for b, p in plan.items():
        max_reps = max(p["reps"].values(), default=0)
        for rep in range(max_reps):
            shift = rep % len(filesystems)
            order = filesystems[shift:] + filesystems[:shift]
            for g in p["groups"]:
                if rep >= p["reps"][g]:
                    continue
                for pos, fs in enumerate(order):
                    yield b, rep, g, fs, pos


def stolen_reason(record: dict) -> str | None:
    """Why a run says little about the filesystem, if it does: one of its timed steps lost
    ≥ STOLEN_NOTE % of all CPU time to the hypervisor (the worst one is named)."""
    stolen = record.get("stolen_pct", {})
    worst = max(stolen, key=stolen.get, default=None)
    if worst is None or stolen[worst] < report.STOLEN_NOTE:
        return None
    return f"{worst} lost {stolen[worst]:.1f} % of CPU time to the hypervisor"


# ------------------------------------------------------------------ machine

def machine_info(disk_dir: Path) -> dict:
    def out(cmd):
        try:
            return run(cmd, timeout=20, check=False).stdout.decode().strip()
        except (OSError, StepError):
            return ""
    lscpu = {}
    for line in out(["lscpu"]).splitlines():
        key, _, val = line.partition(":")
        lscpu[key.strip()] = val.strip()
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    source = out(["findmnt", "-n", "-o", "SOURCE", "-T", str(disk_dir)])
    disk = out(["lsblk", "-dno", "NAME,SIZE,ROTA,MODEL", source]) if source.startswith("/dev/") else ""
    return {
        "cpu": lscpu.get("Model name", platform.processor()),
        "cpus": os.cpu_count(),
        "cpu_flags_aes": "aes" in lscpu.get("Flags", "").split(),
        "hypervisor": lscpu.get("Hypervisor vendor", ""),
        "kernel": platform.release(),
        "os": out(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "disk_dir": str(disk_dir),
        "disk_fs": out(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "-T", str(disk_dir)]),
        "disk_device": disk,
        "python": platform.python_version(),
        # How long an idle virtual CPU polls before it halts: with 0 every wake-up of an idle
        # CPU is a trip through the hypervisor, and a FUSE request pays it twice.
        "cpuidle": "/".join(x for x in (
            _read("/sys/devices/system/cpu/cpuidle/current_driver"),
            _read("/sys/devices/system/cpu/cpuidle/current_governor")) if x),
        "guest_halt_poll_ns": _read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
    }


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def ensure_matplotlib(allow_install: bool, log) -> str | None:
    try:
        import matplotlib  # noqa: F401
        return None
    except ImportError:
        pass
    if not allow_install:
        return "matplotlib missing (--no-install)"
    log("installing matplotlib (pip)")
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"],
                         capture_output=True)
    if res.returncode != 0 and sys.executable.startswith("/usr/bin/"):
        subprocess.run(["apt-get", "install", "-y", "-q", "python3-matplotlib"],
                       capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    try:
        import importlib
        importlib.invalidate_caches()
        import matplotlib  # noqa: F401,F811
        return None
    except ImportError:
        return "matplotlib could not be installed"


# ------------------------------------------------------------------ runner

class Runner:
    """Holds the state of one invocation: resources, results, progress."""

    def __init__(self, args) -> None:
        self.args = args
        self.cleanup = Cleanup(log=self.log)
        self.fs_table = registry()
        self.filesystems: list[Filesystem] = [self.fs_table[n] for n in args.fs]
        self.plan = make_plan(args)
        self.sizes = Sizes.quick() if args.quick else Sizes()
        self.runs: list[dict] = []
        self.fs_info: dict = {}
        self.progress: Progress | None = None
        self.interrupted: str | None = None
        self.started = dt.datetime.now(dt.timezone.utc)
        self.run_dir: Path | None = None
        self.mount_count = 0

    def log(self, message: str) -> None:
        if self.progress:
            self.progress.message(message)
        else:
            print(message, file=sys.stderr, flush=True)

    # -------------------------------------------------------------- setup
    def prepare(self) -> None:
        args = self.args
        if os.geteuid() != 0:
            raise SystemExit("bench/run needs root (mounts, drop_caches)")
        args.out.mkdir(parents=True, exist_ok=True)
        self.run_dir = Path(tempfile.mkdtemp(prefix="veilbench-run-"))
        self.cleanup.push(f"rm -r {self.run_dir}", lambda: remove_unless_mounted(self.run_dir))
        for sub in ("mnt", "logs", "secrets"):
            (self.run_dir / sub).mkdir()
        os.chmod(self.run_dir / "secrets", 0o700)
        self.secrets = Secrets(passfile=self.run_dir / "secrets" / "password",
                               keyfile=self.run_dir / "secrets" / "keyfile")
        self.secrets.passfile.write_text("veilbench-not-a-secret\n")
        os.chmod(self.secrets.passfile, 0o600)
        self.secrets.keyfile.write_bytes(os.urandom(64))
        if args.quick:
            Ext4LoopFs.IMAGE_SIZE = "1G"
        self._install_tools()
        self.source = self.run_dir / "source"
        self.source.mkdir()
        self.cleanup.push(f"rmdir {self.source}", lambda: self.source.rmdir())
        run(["mount", "-t", "tmpfs", "-o", f"size={'3G' if args.quick else '8G'}",
             "veilbench-source", str(self.source)], timeout=30)
        self.cleanup.push(f"umount {self.source}", lambda: force_unmount(self.source))
        self.data = Datasets(args.cache_dir, self.source, args.quick, self.log)
        self.backings = {b: backing_mod.make(b, args.tmpfs_size, args.disk_dir)
                         for b in self.plan}
        for b in self.backings.values():
            b.setup(self.run_dir, self.cleanup)
        self.prepare_data()

    def prepare_data(self) -> None:
        """Build every input up front, so no dataset preparation lands
        inside (or before) one filesystem's first run and skews it."""
        groups = {g for p in self.plan.values() for g in p["groups"]}
        if not any(self.fs_info[f]["available"] for f in self.args.fs):
            return
        self.log("preparing datasets")
        s = self.sizes
        if "bigfile" in groups:
            self.data.random_file("random-big", s.bigfile)
        if "randio" in groups:
            self.data.random_file("random-fio", s.fio_file)
        if "manyfiles" in groups:
            self.data.many_files(s.many_count, s.many_size)
        if "mixed" in groups:
            self.data.mixed_folder(s.mixed_total)
        if "kernel" in groups:
            self.data.rsync_destination()
        if "reverse" in groups:
            self.data.tree()
        if "build" in groups:
            self.data.build_project()

    def _install_tools(self) -> None:
        args = self.args
        extra = [pkg for tool, pkg in (("fio", "fio"), ("rsync", "rsync"), ("make", "make"),
                                       ("gcc", "gcc")) if not which(tool)]
        groups = {g for p in self.plan.values() for g in p["groups"]}
        if "build" in groups and not args.quick:
            extra += [p for p in BUILD_PACKAGES if not _dpkg_installed(p)]
        install_error = None
        if not args.no_install:
            install_error = ensure_installed(self.filesystems, extra, self.log)
        for fs in self.filesystems:
            reason = fs.unavailable_reason()
            if reason and install_error and fs.packages:
                reason += f"; {install_error}"
            version = ""
            if not reason:
                try:
                    version = fs.version()
                except (OSError, StepError) as exc:
                    version = f"(version unknown: {exc})"
            self.fs_info[fs.name] = {"title": fs.title, "available": reason is None,
                                     "reason": reason, "version": version}
        chart_error = ensure_matplotlib(not args.no_install, self.log)
        if chart_error:
            self.log(f"warning: {chart_error}; no chart will be drawn")

    # -------------------------------------------------------------- loop
    def run_matrix(self) -> None:
        steps = list(schedule(self.plan, self.args.fs))
        self.progress = Progress(len(steps))
        for b, rep, g, fs, pos in steps:
            label = f"{b} rep {rep + 1} {g} {fs}"
            self.progress.step(label)
            record = self.run_one(self.backings[b], self.fs_table[fs], GROUPS_BY_NAME[g], rep, pos)
            for _ in range(self.args.retry_stolen):
                why = stolen_reason(record)
                if why is None:
                    break
                record["discarded"] = why
                self.runs.append(record)
                self.write_json(final=False)
                self.progress.message(f"  {label}: {why}; running it again")
                record = self.run_one(self.backings[b], self.fs_table[fs], GROUPS_BY_NAME[g], rep, pos)
            self.runs.append(record)
            if record["errors"]:
                first = next(iter(record["errors"].values()))
                if not first.startswith("unavailable"):
                    self.progress.message(f"  {label}: {first}")
            self.write_json(final=False)
            self.progress.advance(label)
        self.progress.close()

    def run_one(self, backing, fs: Filesystem, group, rep: int, pos: int) -> dict:
        record = {"backing": backing.name, "fs": fs.name, "group": group.name, "rep": rep,
                  "order": pos, "started": time.time(), "values": {}, "na": {}, "errors": {}}
        cpu_start = cpu_times()
        info = self.fs_info[fs.name]
        if not info["available"]:
            self._fail(record, group, f"unavailable: {info['reason']}")
            return record
        if group.reverse and not fs.has_reverse():
            record["na"] = {m.name: "no reverse mode" for m in group.metrics}
            record["na"]["peak_rss"] = "no reverse mode"
            return record
        self.mount_count += 1
        store = backing.fresh_dir(fs.name)
        store_token = self.cleanup.push(f"rm -r {store}", lambda: backing_mod.remove_tree(store))
        mnt = self.run_dir / "mnt" / f"{self.mount_count:04d}-{fs.name}"
        mnt.mkdir()
        session = MountSession(fs, store, mnt, self.secrets, self.run_dir / "logs",
                               self.args.mount_timeout, self.cleanup, reverse=group.reverse)
        ctx = None
        try:
            if group.prepare is not None:
                group.prepare(store, self.data, self.args.timeout)
            m = session.open(fresh=True)
            ctx = Context(mount=m, data=self.data, sizes=self.sizes, quick=self.args.quick,
                          timeout=self.args.timeout, session=session)
            try:
                group.run(ctx)
            finally:
                session.close()
        except StepError as exc:
            self._fail(record, group, str(exc))
        except Exception as exc:  # noqa: BLE001 - one broken run must not end the matrix
            self._fail(record, group, f"{type(exc).__name__}: {exc}")
        finally:
            session.close()
            rss = session.peak_rss_mib()
            if rss is not None:
                record["values"]["peak_rss"] = rss
                record["errors"].pop("peak_rss", None)
            elif not session.had_daemon and "peak_rss" not in record["errors"]:
                record["na"]["peak_rss"] = "no FUSE daemon"
            if ctx is not None:
                record["values"].update(ctx.values)
                record["na"].update(ctx.na)
                if ctx.stolen:
                    record["stolen_pct"] = dict(ctx.stolen)
                record["errors"] = {k: v for k, v in record["errors"].items()
                                    if k not in record["values"] and k not in record["na"]}
            self.cleanup.release(store_token)
            if not is_mounted(mnt):   # never stat a possibly hung mount point
                mnt.rmdir()
        record["seconds"] = time.time() - record["started"]
        # Other work on the machine skews timings; keep the evidence per run: the load, the
        # share of CPU time the hypervisor took, and the pipe round trip after the run.
        record["loadavg_1min"] = float(Path("/proc/loadavg").read_text().split()[0])
        total, steal = cpu_times()
        if total > cpu_start[0]:
            record["steal_pct"] = round(100 * (steal - cpu_start[1]) / (total - cpu_start[0]), 2)
        record["wakeup_us"] = round(wakeup_round_trip_us(), 2)
        return record

    def _fail(self, record: dict, group, message: str) -> None:
        message = self.sanitize(message)
        for metric in group.metrics:
            record["errors"].setdefault(metric.name, message)
        record["errors"].setdefault("peak_rss", message)

    def sanitize(self, message: str) -> str:
        """Replace this run's temporary paths by stable placeholders, so the
        same failure in every repetition reads (and is footnoted) the same."""
        message = re.sub(re.escape(str(self.run_dir)) + r"/mnt/\d+-", "<mnt>/", message)
        message = message.replace(str(self.run_dir), "<run>")
        for b in getattr(self, "backings", {}).values():
            if b.root:
                message = re.sub(re.escape(str(b.root)) + r"/\d+-", "<store>/", message)
        return message

    # -------------------------------------------------------------- output
    def metrics_for(self, b: str):
        return all_metrics([GROUPS_BY_NAME[g] for g in self.plan[b]["groups"]])

    def summary(self) -> dict:
        return {b: report.summarize(self.runs, [b], self.args.fs, self.metrics_for(b))[b]
                for b in self.plan}

    def write_json(self, final: bool) -> dict:
        doc = {
            "schema": SCHEMA,
            "created": self.started.isoformat(timespec="seconds"),
            "finished": final and self.interrupted is None,
            "interrupted": self.interrupted,
            "command": "bench/run " + shlex.join(sys.argv[1:]),
            "title": self.args.title or ("veilbench quick smoke run" if self.args.quick
                                         else "veilbench results"),
            "quick": self.args.quick,
            "plan": self.plan,
            "backings": list(self.plan),
            "filesystems": self.args.fs,
            "metrics": {b: [dict(m.__dict__) for m in self.metrics_for(b)] for b in self.plan},
            "groups": {g.name: {"title": g.title, "metrics": [m.name for m in g.metrics]}
                       for g in GROUPS},
            "fs_info": self.fs_info,
            "backing_info": {b: x.describe() for b, x in getattr(self, "backings", {}).items()},
            "machine": getattr(self, "machine", {}),
            "sizes": dict(self.sizes.__dict__),
            "datasets": getattr(getattr(self, "data", None), "notes", {}),
            "runs": self.runs,
            "summary": self.summary(),
        }
        tmp = self.args.out / "results.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        tmp.replace(self.args.out / "results.json")
        return doc

    def write_reports(self) -> None:
        doc = self.write_json(final=True)
        report.write_outputs(doc, self.args.out, self.log)

    # -------------------------------------------------------------- main
    def main(self) -> int:
        install_signal_handlers()
        try:
            self.prepare()
            self.machine = machine_info(self.args.disk_dir)
            self.run_matrix()
        except Interrupted as exc:
            self.interrupted = f"interrupted by {exc}"
            self.log(f"\n{self.interrupted}; cleaning up")
        except StepError as exc:
            self.interrupted = f"setup failed: {exc}"
            self.log(self.interrupted)
        finally:
            ignore_signals()
            if self.progress:
                self.progress.tty = False
            self.cleanup.run_all()
        if self.run_dir is None:
            return 2
        self.write_reports()
        self.log(f"results: {self.args.out}/results.json, results.md, chart.png")
        return 0 if self.interrupted is None else 1


def remove_unless_mounted(path: Path) -> None:
    """Delete the run directory -- unless something is still mounted below
    it, in which case deleting would reach into that filesystem."""
    left = mounts_under(path)
    if left:
        raise StepError(f"not removing {path}: still mounted: {', '.join(left)}")
    shutil.rmtree(path, ignore_errors=True)


def _dpkg_installed(package: str) -> bool:
    res = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", package], capture_output=True)
    return res.returncode == 0 and b"install ok installed" in res.stdout


def render(out: Path, title: str | None) -> int:
    """Recompute summaries from the raw runs in *out*/results.json and
    redraw the tables and chart (after a report change, or to retitle)."""
    path = out / "results.json"
    doc = json.loads(path.read_text())
    if title:
        doc["title"] = title
    doc["summary"] = report.summarize_doc(doc)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    report.write_outputs(doc, out, lambda m: print(m, file=sys.stderr))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render is not None:
        return render(args.render, args.title)
    return Runner(args).main()
