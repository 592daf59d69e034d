"""Unit tests of the parts of veilbench that need no root and no mounts:
the interleaved schedule, ratio direction, summaries (including partial
failures), Markdown rendering and the output checker.

    python3 -m unittest discover -s bench/tests
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import unittest
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from veilbench import SCHEMA, cli, report  # noqa: E402
from veilbench.workloads import GROUPS_BY_NAME, PEAK_RSS, Metric, all_metrics  # noqa: E402
import check_outputs  # noqa: E402  (bench/check_outputs.py)
import targets  # noqa: E402  (bench/targets.py)

FAST = Metric("speed", "speed", "MiB/s", True)
SLOW = Metric("time", "time", "s", False)


class ScheduleTest(unittest.TestCase):
    def test_interleaved_and_rotated(self):
        plan = {"tmpfs": {"groups": ["stream"], "reps": {"stream": 3}}}
        order = [fs for _, _, _, fs, _ in cli.schedule(plan, ["a", "b", "c"])]
        self.assertEqual(order, ["a", "b", "c", "b", "c", "a", "c", "a", "b"])

    def test_group_reps_cap(self):
        args = cli.parse_args(["--backing", "tmpfs", "--workloads", "stream,build",
                               "--group-reps", "build=1", "--fs", "plain"])
        plan = cli.make_plan(args)
        steps = list(cli.schedule(plan, ["plain"]))
        self.assertEqual(sum(1 for s in steps if s[2] == "build"), 1)
        self.assertEqual(sum(1 for s in steps if s[2] == "stream"), 3)


class RatioTest(unittest.TestCase):
    def test_direction_is_better_than_reference(self):
        self.assertAlmostEqual(report.ratio({"median": 200}, {"median": 100}, FAST), 2.0)
        self.assertAlmostEqual(report.ratio({"median": 50}, {"median": 100}, SLOW), 2.0)
        self.assertIsNone(report.ratio({"error": "x"}, {"median": 1}, FAST))


def _run(fs, rep, values=None, errors=None, na=None):
    return {"backing": "tmpfs", "fs": fs, "group": "g", "rep": rep,
            "values": values or {}, "errors": errors or {}, "na": na or {}}


class SummaryTest(unittest.TestCase):
    def test_median_and_partial_failure(self):
        runs = [_run("x", 0, {"time": 3.0}), _run("x", 1, {"time": 1.0}),
                _run("x", 2, errors={"time": "boom"})]
        cell = report.summarize(runs, ["tmpfs"], ["x"], [SLOW])["tmpfs"]["x"]["time"]
        self.assertEqual((cell["median"], cell["min"], cell["max"], cell["n"]), (2.0, 1.0, 3.0, 2))
        self.assertEqual((cell["failed"], cell["error"]), (1, "boom"))

    def test_error_and_na_cells(self):
        runs = [_run("x", 0, errors={"time": "unavailable: nope"}),
                _run("y", 0, na={"time": "no daemon"})]
        s = report.summarize(runs, ["tmpfs"], ["x", "y"], [SLOW])["tmpfs"]
        self.assertEqual(s["x"]["time"], {"error": "unavailable: nope"})
        self.assertEqual(s["y"]["time"], {"na": "no daemon"})

    def test_peak_rss_is_max_per_rep(self):
        runs = [_run("x", 0, {"peak_rss": 10.0}), _run("x", 0, {"peak_rss": 30.0}),
                _run("x", 1, {"peak_rss": 20.0})]
        cell = report.summarize(runs, ["tmpfs"], ["x"], [PEAK_RSS])["tmpfs"]["x"]["peak_rss"]
        self.assertEqual(sorted(cell["values"]), [20.0, 30.0])


class HostContentionTest(unittest.TestCase):
    """Each run records the hypervisor's share of CPU time and a pipe round trip, and the
    results' header reports them."""

    def test_probes_measure_and_the_header_reports_them(self):
        from veilbench import proc
        self.assertGreater(proc.wakeup_round_trip_us(200), 0)
        total, steal = proc.cpu_times()
        self.assertGreaterEqual(total, steal)
        self.assertGreaterEqual(steal, 0)
        doc = {"command": "c", "created": "now", "finished": True, "plan": {}, "fs_info": {},
               "runs": [{"steal_pct": 1.0, "wakeup_us": 9.0}, {"steal_pct": 5.0, "wakeup_us": 40.0},
                        {"steal_pct": 2.0, "wakeup_us": 11.0}]}
        self.assertIn("median 2.0 %, max 5.0 %", report.markdown_header(doc))
        self.assertIn("median 11.0 µs, range 9.0–40.0 µs", report.markdown_header(doc))


class StolenPerStepTest(unittest.TestCase):
    """Each timed step records the share of CPU time the hypervisor took while it ran; the
    header counts the steps that lost much, and targets.py names the rows whose median
    repetition did."""

    def test_a_step_records_its_stolen_share_once(self):
        from types import SimpleNamespace
        from veilbench import workloads
        ctx = workloads.Context(mount=SimpleNamespace(path=Path("/")), data=None,
                                sizes=workloads.Sizes.quick(), quick=True, timeout=10)
        ctx.record("before_any_step", 1.0)
        ctx.record("x", ctx.timed(["true"]))
        ctx.record("derived", 2.0)
        self.assertEqual(list(ctx.stolen), ["x"])
        self.assertTrue(0.0 <= ctx.stolen["x"] <= 100.0)

    def test_median_repetition_and_reports(self):
        self.assertEqual(report.stolen_at_median({"values": [3.0, 1.0, 2.0], "stolen": [50.0, 0.0, 20.0]}), 20.0)
        self.assertEqual(report.stolen_at_median({"values": [4.0, 1.0, 2.0, 3.0], "stolen": [0, 1, 30, 2]}), 30)
        self.assertIsNone(report.stolen_at_median({"values": [1.0]}))
        doc = {"command": "c", "created": "now", "finished": True, "plan": {}, "fs_info": {},
               "runs": [{"stolen_pct": {"a": 1.0, "b": 25.0}}, {"stolen_pct": {"a": 12.0}}, {}]}
        self.assertIn("to the hypervisor: 2 of 3 (worst 25.0 %)", report.markdown_header(doc))
        metrics = all_metrics([GROUPS_BY_NAME["manyfiles"]])
        runs = [{"backing": "tmpfs", "fs": fs, "group": "manyfiles", "rep": rep,
                 "values": {"many_out": t}, "stolen_pct": {"many_out": st}, "na": {}, "errors": {}}
                for fs, rep, t, st in (("veilfs", 0, 6.6, 30.0), ("veilfs", 1, 2.3, 1.0), ("veilfs", 2, 6.8, 2.0),
                                       ("securefs", 0, 2.4, 0.5), ("gocryptfs", 0, 2.6, 0.0))]
        doc = {"metrics": {"tmpfs": [dict(m.__dict__) for m in metrics]}, "backings": ["tmpfs"],
               "filesystems": ["veilfs", "securefs", "gocryptfs"], "runs": runs}
        per_fs = report.summarize_doc(doc)["tmpfs"]
        lines = targets.stolen_rows(per_fs, {m.name: m for m in metrics})
        self.assertEqual(lines, ["- many files cp out: veilfs 30.0 %, securefs 0.5 %"])
        runs[0]["stolen_pct"]["many_out"] = 3.0
        per_fs = report.summarize_doc(doc)["tmpfs"]
        self.assertEqual(targets.stolen_rows(per_fs, {m.name: m for m in metrics}), [])


class RetryStolenTest(unittest.TestCase):
    """A repetition in which a timed step lost ≥ 10 % of all CPU time to the hypervisor is run
    again (up to --retry-stolen times); the discarded run stays in the record, out of the
    medians, and the header names it."""

    def _runner(self, stolen_per_attempt, retries):
        import io
        from types import SimpleNamespace
        def run_one(backing, fs, group, rep, pos):
            n = len(runner.tried)
            runner.tried.append(n)
            return {"backing": "tmpfs", "fs": "veilfs", "group": "manyfiles", "rep": rep, "order": pos,
                    "values": {"many_out": 2.0 + n}, "na": {}, "errors": {}, "attempt": n + 1,
                    "stolen_pct": {"many_in": 0.0, "many_out": stolen_per_attempt[n]}}

        runner = SimpleNamespace(
            plan={"tmpfs": {"groups": ["manyfiles"], "reps": {"manyfiles": 1}}},
            args=SimpleNamespace(fs=["veilfs"], retry_stolen=retries), backings={"tmpfs": None},
            fs_table={"veilfs": None}, runs=[], tried=[], run_one=run_one, write_json=lambda final: None)
        import veilbench.progress as progress
        real = cli.Progress
        cli.Progress = lambda total: progress.Progress(total, stream=io.StringIO())
        try:
            cli.Runner.run_matrix(runner)
        finally:
            cli.Progress = real
        return runner.runs

    def test_a_stolen_run_is_run_again_and_left_out_of_the_medians(self):
        runs = self._runner([30.0, 12.0, 1.0], retries=2)
        self.assertEqual([r["attempt"] for r in runs], [1, 2, 3])
        self.assertEqual([bool(r.get("discarded")) for r in runs], [True, True, False])
        self.assertEqual(runs[0]["discarded"], "many_out lost 30.0 % of CPU time to the hypervisor")
        metrics = all_metrics([GROUPS_BY_NAME["manyfiles"]])
        cell = report.summarize(runs, ["tmpfs"], ["veilfs"], metrics)["tmpfs"]["veilfs"]["many_out"]
        self.assertEqual(cell["values"], [4.0])
        doc = {"command": "c", "created": "now", "finished": True, "plan": {}, "fs_info": {}, "runs": runs}
        header = report.markdown_header(doc)
        self.assertIn("to the hypervisor: 0 of 2 (worst 1.0 %)", header)
        self.assertIn("run again because a timed step lost ≥ 10 % to the hypervisor (kept in results.json, "
                      "not in the medians): 2 — veilfs manyfiles rep 1 (many_out lost 30.0 %", header)

    def test_retries_are_bounded_and_a_clean_run_is_not_repeated(self):
        runs = self._runner([40.0, 40.0, 40.0, 40.0], retries=2)
        self.assertEqual([bool(r.get("discarded")) for r in runs], [True, True, False])
        self.assertEqual(len(self._runner([9.9], retries=2)), 1)
        self.assertEqual(len(self._runner([50.0], retries=0)), 1)
        self.assertEqual(cli.parse_args(["--quick"]).retry_stolen, 0)
        self.assertEqual(cli.parse_args([]).retry_stolen, 2)

    def test_du_is_not_a_timed_step(self):
        from types import SimpleNamespace
        from veilbench import workloads
        ctx = workloads.Context(mount=SimpleNamespace(path=Path("/")), data=None,
                                sizes=workloads.Sizes.quick(), quick=True, timeout=10)
        ctx.step_start = workloads.cpu_times()
        ctx.record("du", 14.0, timed=False)
        ctx.record("after", 1.0)
        self.assertEqual(ctx.stolen, {})
        self.assertEqual(ctx.values, {"du": 14.0, "after": 1.0})


class OutputsTest(unittest.TestCase):
    """A synthetic results.json rendered by report.write_outputs must pass
    check_outputs; a broken one must not."""

    def _doc(self):
        metrics = all_metrics([GROUPS_BY_NAME["stream"]])
        runs = [{"backing": "tmpfs", "fs": "plain", "group": "stream", "rep": 0,
                 "values": {"stream_write": 100.0, "stream_read": 200.0},
                 "na": {"cpu_per_gib": "no FUSE daemon", "peak_rss": "no FUSE daemon"},
                 "errors": {}},
                {"backing": "tmpfs", "fs": "veilfs", "group": "stream", "rep": 0,
                 "values": {}, "na": {},
                 "errors": {m.name: "unavailable: not built" for m in metrics}}]
        doc = {"schema": SCHEMA, "created": "now", "finished": True, "interrupted": None,
               "command": "bench/run --quick", "title": "t", "quick": True,
               "plan": {"tmpfs": {"groups": ["stream"], "reps": {"stream": 1}}},
               "backings": ["tmpfs"], "filesystems": ["plain", "veilfs"],
               "metrics": {"tmpfs": [dict(m.__dict__) for m in metrics]},
               "groups": {"stream": {"title": "s", "metrics": [m.name for m in
                                                              GROUPS_BY_NAME["stream"].metrics]}},
               "fs_info": {"plain": {"title": "plain", "available": True, "reason": None,
                                     "version": ""},
                           "veilfs": {"title": "veilfs", "available": False,
                                      "reason": "not built", "version": ""}},
               "machine": {}, "datasets": {}, "runs": runs}
        doc["summary"] = report.summarize_doc(doc)
        return doc

    def _write(self, doc, out: Path):
        (out / "results.json").write_text(json.dumps(doc))
        report.write_outputs(doc, out, lambda m: None)

    def test_rendered_outputs_pass_the_checker(self):
        with tempfile.TemporaryDirectory() as d:
            self._write(self._doc(), Path(d))
            rc = check_outputs.main([d, "--expect-fs", "plain,veilfs", "--expect-backing", "tmpfs"])
            self.assertEqual(rc, 0)

    def test_checker_rejects_missing_cells_and_bad_png(self):
        with tempfile.TemporaryDirectory() as d:
            doc = self._doc()
            self._write(doc, Path(d))
            del doc["summary"]["tmpfs"]["veilfs"]["stream_read"]
            (Path(d) / "results.json").write_text(json.dumps(doc))
            (Path(d) / "chart.png").write_bytes(b"not a png")
            self.assertEqual(check_outputs.main([d]), 1)


class TargetsTest(unittest.TestCase):
    """bench/targets.py: ratio directions and the before/after table."""

    @staticmethod
    def _run_dir(d: Path, write: dict[str, float], delete: dict[str, float]) -> Path:
        metrics = all_metrics([GROUPS_BY_NAME["stream"], GROUPS_BY_NAME["kernel"]])
        runs = [{"backing": "tmpfs", "fs": fs, "group": "g", "rep": 0,
                 "values": {"stream_write": write[fs], "delete": delete[fs]}, "na": {}, "errors": {}}
                for fs in write]
        doc = {"metrics": {"tmpfs": [dict(m.__dict__) for m in metrics]}, "backings": ["tmpfs"],
               "filesystems": list(write), "runs": runs}
        d.mkdir()
        (d / "results.json").write_text(json.dumps(doc))
        return d

    def test_ratios_and_before_after(self):
        import contextlib
        import io
        fss = ("plain", "fuse-floor", "veilfs", "gocryptfs")
        with tempfile.TemporaryDirectory() as t:
            before = self._run_dir(Path(t) / "a", dict(zip(fss, (1000, 500, 200, 100))),
                                   dict(zip(fss, (1.0, 2.0, 4.0, 3.0))))
            after = self._run_dir(Path(t) / "b", dict(zip(fss, (1000, 500, 400, 100))),
                                  dict(zip(fss, (1.0, 2.0, 2.0, 3.0))))
            per_fs, metrics = targets.load(after, "tmpfs")
            # 400 vs gocryptfs 100 MiB/s: 4x better; floor 500: costs 1.25; plain 1000: 0.4x.
            self.assertEqual(targets.ratios(per_fs, metrics["stream_write"], "stream_write"), (4.0, 1.25, 0.4))
            # 2 s vs gocryptfs 3 s (time: lower is better): 1.5x better; floor 2 s: cost 1.0.
            vg, cost, vp = targets.ratios(per_fs, metrics["delete"], "delete")
            self.assertAlmostEqual(vg, 1.5)
            self.assertAlmostEqual(cost, 1.0)
            self.assertAlmostEqual(vp, 0.5)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(targets.main([str(after), "--before", str(before)]), 0)
            rows = {line.split(" | ")[0].strip("| "): line for line in out.getvalue().splitlines()}
            self.assertIn("| 2.00 | 4.00 | 2.50 | 1.25 | 0.20 | 0.40 |", rows["stream_write"])
            self.assertIn("| 0.75 | 1.50 | 2.00 | 1.00 | 0.25 | 0.50 |", rows["delete (rm -rf + sync)"])

    def test_round2_best_peer_floor_and_counts(self):
        import contextlib
        import io
        fss = ("plain", "fuse-floor", "veilfs", "gocryptfs", "securefs")
        with tempfile.TemporaryDirectory() as t:
            # write: securefs (300 MiB/s) is the best peer; veilfs 450 is 1.5x it, 4.5x gocryptfs,
            # and the floor (500) is 5x gocryptfs, so "2x gocryptfs" applies; cost 500/450 = 1.11.
            # delete: veilfs 2.4 s vs gocryptfs 2 s: behind the best peer (0.83x).
            run = self._run_dir(Path(t) / "r", dict(zip(fss, (1000, 500, 450, 100, 300))),
                                dict(zip(fss, (1.0, 2.0, 2.4, 2.0, 3.0))))
            per_fs, metrics = targets.load(run, "tmpfs")
            self.assertEqual(targets.best_peer(per_fs, metrics["stream_write"], "stream_write"), ("securefs", 300))
            self.assertEqual(targets.best_peer(per_fs, metrics["delete"], "delete"), ("gocryptfs", 2.0))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(targets.main([str(run)]), 0)
            rows = {line.split(" | ")[0].strip("| "): line for line in out.getvalue().splitlines()}
            self.assertIn("| securefs | 1.50 | 4.50 | 5.00 | 1.11 |", rows["stream_write (MiB/s)"])
            self.assertIn("peer ✓, 2× gocryptfs ✓, floor ✓", rows["stream_write (MiB/s)"])
            self.assertIn("| gocryptfs | 0.83 |", rows["delete (rm -rf + sync) (s)"])
            self.assertIn("peer ✗, floor ✗", rows["delete (rm -rf + sync) (s)"])
            self.assertIn("Targets met: 3 of 5.", out.getvalue())

    def test_synced_folder_rows_count_the_locked_mount_only(self):
        metrics = {m.name: m for m in GROUPS_BY_NAME["warm-sync"].metrics}
        per_fs = {fs: {"wsync_ls": {"median": t}, "wsync_find": {"median": t / 2},
                       "wsync_fresh": {"median": fresh}}
                  for fs, t, fresh in (("plain", 1.0, 0.0), ("veilfs", 1.25, 0.4), ("veilfs-shared", 3.0, 1.0))}
        per_fs["veilfs"]["wsync_find"] = {"median": 0.7}
        met = [0, 0]
        lines = targets.synced_rows(per_fs, metrics, met)
        self.assertEqual(met, [1, 2], "ls 1.25x met, find 1.4x not; veilfs-shared not counted")
        self.assertIn("2nd ls -lR: 1.25× plain's time (target ≤ 1.3) ✓; veilfs-shared 3.00×", lines[0])
        self.assertIn("find -newer: 1.40× plain's time (target ≤ 1.3) ✗", lines[1])
        self.assertIn("- veilfs: a delivered change showed after 0.40 s", lines[2])

    def test_several_runs_take_each_workload_whole_from_one_run(self):
        fss = ("plain", "veilfs", "gocryptfs")
        with tempfile.TemporaryDirectory() as t:
            first = self._run_dir(Path(t) / "a", dict(zip(fss, (1000, 400, 100))), dict(zip(fss, (1.0, 2.0, 3.0))))
            second = self._run_dir(Path(t) / "b", dict(zip(fss, (900, 300, 50))), dict(zip(fss, (9.0, 9.0, 9.0))))
            # A run without veilfs lends nothing, not even its peers' cells.
            peers_only = self._run_dir(Path(t) / "c", {"plain": 1, "gocryptfs": 1}, {"plain": 1, "gocryptfs": 1})
            per_fs, metrics = targets.merge([targets.load(d, "tmpfs") for d in (peers_only, first, second)])
            self.assertEqual({fs: targets.median(per_fs, fs, "stream_write") for fs in fss},
                             {"plain": 1000, "veilfs": 400, "gocryptfs": 100})
            self.assertEqual(targets.ratios(per_fs, metrics["delete"], "delete")[0], 1.5)
            import contextlib
            import io
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(targets.main([str(peers_only), str(first), str(second)]), 0)


class WarmGroupTest(unittest.TestCase):
    """The warm group times the second walk: every timed command ran untimed
    just before, caches are never dropped, and each metric is recorded."""

    def test_second_walks_timed_without_dropping_caches(self):
        from types import SimpleNamespace
        from veilbench import workloads

        top = Path("/m/linux")
        data = SimpleNamespace(
            tree=lambda: SimpleNamespace(top="linux", tarball=Path("/s/linux.tar")),
            rsync_destination=lambda: Path("/s/rsync-dest"),
            build_project=lambda: SimpleNamespace(tarball=Path("/s/p.tar"), members=["p"],
                                                  command=["make", "-C", "p"]),
            git_repo=lambda: Path("/s/tree.git"))
        ctx = workloads.Context(mount=SimpleNamespace(path=Path("/m")), data=data,
                                sizes=workloads.Sizes.quick(), quick=True, timeout=10)
        log = []
        ctx.settle = lambda: self.fail("the warm group drops no caches")
        ctx.timed = lambda cmd, **kw: log.append(("timed", cmd)) or 1.5
        saved = workloads.run
        workloads.run = lambda cmd, **kw: log.append(("run", cmd))
        try:
            workloads.run_warm(ctx)
        finally:
            workloads.run = saved
        group = workloads.GROUPS_BY_NAME["warm"]
        self.assertEqual(sorted(ctx.values), sorted(m.name for m in group.metrics))
        self.assertTrue(all(not m.higher_is_better and m.unit == "s" for m in group.metrics))
        for i, (kind, cmd) in enumerate(log):
            if kind == "timed" and log[i - 1] != ("timed", cmd):
                self.assertEqual(log[i - 1], ("run", cmd), f"{cmd} ran once before it was timed")
        status = [c for k, c in log if k == "timed" and "status" in c]
        self.assertEqual(len(status), workloads.RUNS["git_status"], "git status: the median of several runs")
        self.assertIn(("timed", ["find", str(top), "-newer", "/m/warm-ref"]), log)
        self.assertTrue(any(k == "run" and "clone" in c for k, c in log), "the checkout is cloned untimed")


class SharedStorageVariantTest(unittest.TestCase):
    """veilfs-shared is veilfs's entry with --shared-storage on its mount, side by side
    with the others in one run."""

    def test_the_variant_is_veilfs_with_one_more_flag(self):
        from veilbench.filesystems import registry
        table = registry()
        veil, shared = table["veilfs"], table["veilfs-shared"]
        self.assertEqual(list(shared.mount_cmd), [*veil.mount_cmd, "--shared-storage"])
        for attr in ("binary", "init_cmd", "unmount_cmd", "fsck_cmd", "version_cmd", "foreground"):
            self.assertEqual(getattr(shared, attr), getattr(veil, attr), attr)
        self.assertEqual(shared.init_args(), veil.init_args())   # the cheap KDF too
        self.assertTrue(veil.has_reverse())
        self.assertFalse(shared.has_reverse())
        args = cli.parse_args(["--fs", "plain,veilfs,veilfs-shared", "--workloads", "warm,warm-sync",
                               "--backing", "tmpfs"])
        self.assertEqual(args.fs, ["plain", "veilfs", "veilfs-shared"])
        self.assertEqual(args.workloads, ["warm", "warm-sync"])


class NoBlockMapVariantTest(unittest.TestCase):
    """veilfs-v1 is veilfs's entry with a vault made by init --no-block-map: the file format
    before the block map, side by side in one run to measure what the map costs."""

    def test_the_variant_is_veilfs_with_one_more_init_flag(self):
        from veilbench.filesystems import registry
        table = registry()
        veil, v1 = table["veilfs"], table["veilfs-v1"]
        self.assertEqual(list(v1.init_cmd), [*veil.init_cmd[:3], "--no-block-map", *veil.init_cmd[3:]])
        for attr in ("binary", "mount_cmd", "unmount_cmd", "fsck_cmd", "version_cmd", "foreground"):
            self.assertEqual(getattr(v1, attr), getattr(veil, attr), attr)
        self.assertFalse(v1.has_reverse())


class RegistryTest(unittest.TestCase):
    def test_every_filesystem_mounts_as_a_session_calls_it(self):
        """MountSession passes reverse= to every filesystem (ext4-loop and fscrypt once
        refused it, and every one of their runs failed)."""
        import inspect
        from veilbench.filesystems import registry
        for fs in registry().values():
            inspect.signature(fs.mount).bind(Path("s"), Path("m"), None, Path("l"), 1.0,
                                             fresh=False, reverse=False)


class WarmSyncTest(unittest.TestCase):
    """warm-sync: the warm group's steps under their own names while another machine
    writes, its changes per step and a freshness sample."""

    def test_every_warm_metric_has_its_sync_twin_and_a_change_count(self):
        from veilbench import workloads
        warm = [m.name for m in GROUPS_BY_NAME["warm"].metrics]
        sync = {m.name: m for m in GROUPS_BY_NAME["warm-sync"].metrics}
        self.assertEqual(sorted(workloads.SYNC_KEYS), sorted(warm))
        for name in warm:
            twin = workloads.SYNC_KEYS[name]
            self.assertEqual((sync[twin].unit, sync[twin].higher_is_better), ("s", False))
            self.assertEqual(sync[f"{twin}_changes"].unit, "changes")
        self.assertIn("wsync_fresh", sync)
        self.assertEqual(len(sync), 2 * len(warm) + 1)
        self.assertFalse(set(sync) & {m.name for g in workloads.GROUPS if g.name != "warm-sync"
                                      for m in g.metrics}, "metric names are unique")

    def test_writer_directories(self):
        from veilbench import workloads
        writes, probed = workloads.sync_directories("linux", ["Documentation", "arch", "virt"])
        self.assertEqual(writes, [Path("linux/Documentation"), Path("checkout/linux/Documentation"),
                                  Path("sync-inbox")])
        self.assertEqual(probed, Path("linux/virt"))
        self.assertNotIn(probed, writes, "the freshness probe's directory is the writer's alone")

    def test_only_the_other_machines_vanished_files_are_forgiven(self):
        from veilbench.workloads import only_vanished
        find = b"find: '/m/linux/dir00/veilbench-sync-000003.txt': No such file or directory\n"
        ls = b"ls: cannot access '/m/linux/dir00/.veilbench-sync-000004.txt.Ab12Cd': No such file or directory\n"
        rsync = (b'file has vanished: "/m/linux/dir00/veilbench-sync-000007.txt"\n'
                 b"rsync warning: some files vanished before they could be transferred (code 24) at main.c(1338)\n")
        self.assertTrue(only_vanished(1, find))
        self.assertTrue(only_vanished(1, find + ls))
        self.assertTrue(only_vanished(24, rsync))
        self.assertFalse(only_vanished(0, b""), "success is not a vanish")
        self.assertFalse(only_vanished(1, b""), "a failure with no message is a failure")
        self.assertFalse(only_vanished(1, b"find: '/m/linux': No such file or directory\n"),
                         "the tree itself missing is a failure")
        self.assertFalse(only_vanished(2, find), "ls's serious trouble (exit 2) is a failure")
        self.assertFalse(only_vanished(1, find + b"find: '/m/x': Input/output error\n"))


@unittest.skipUnless(shutil.which("rsync"), "needs rsync")
class OtherMachineTest(unittest.TestCase):
    """The other machine's pieces that need no mount: finding a directory's ciphertext,
    and the writer process delivering its changes until it is killed."""

    def test_cipher_dir_follows_the_probe(self):
        from veilbench.othermachine import NotSynced, cipher_dir
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "store"
            (root / "linux" / "arch").mkdir(parents=True)
            (root / "linux" / "virt").mkdir()
            (root / "checkout").mkdir()
            # plain storage: a plaintext directory is its own ciphertext directory
            self.assertEqual(cipher_dir(root, root, Path("linux/arch")), root / "linux" / "arch")
            self.assertEqual(sorted(p.name for p in (root / "linux" / "arch").iterdir()), [])
            # a store that does not change when the plaintext does has no such directory
            with self.assertRaises(NotSynced):
                cipher_dir(root, Path(tmp), Path("linux/arch"))

    def test_the_writer_delivers_until_killed(self):
        import subprocess
        from veilbench import othermachine as om
        from veilbench.proc import kill_group
        with tempfile.TemporaryDirectory() as tmp:
            other, store = Path(tmp) / "other", Path(tmp) / "store"
            for root in (other, store):
                (root / "d").mkdir(parents=True)
                (root / "d" / "kept.c").write_text("int x;\n")
            (store / "d" / "sub").mkdir()
            (other / "d" / "sub").mkdir()
            (store / "d" / "sub" / "deep.c").write_text("deep\n")
            d = om.Delivery(plain=other / "d", source=other / "d", target=store / "d")
            status = Path(tmp) / "writer.status"
            here = om.cpu_list(frozenset(sorted(os.sched_getaffinity(0))[:1]))   # deliveries via taskset
            proc = subprocess.Popen([sys.executable, "-m", "veilbench.othermachine", str(status), "0.05",
                                     here, *d.args()], cwd=BENCH, start_new_session=True)
            try:
                deadline = time.monotonic() + 20
                while self._changes(status) < 12 and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                kill_group(proc)
            self.assertGreaterEqual(self._changes(status), 12, "created, replaced and deleted")
            self.assertNotEqual(proc.returncode, 0, "stopped by its PID, not on its own")
            mine = sorted(p.name for p in (store / "d").glob("veilbench-sync-*"))
            self.assertLessEqual(len(mine), om.KEEP + 1, "the oldest are deleted")
            self.assertTrue(mine, "its files were delivered")
            self.assertEqual((store / "d" / "kept.c").read_text(), "int x;\n")
            self.assertEqual((store / "d" / "sub" / "deep.c").read_text(), "deep\n",
                             "a delivery touches the directory's own entries only")

    def test_the_cpus_are_split_between_the_two_machines(self):
        from veilbench.othermachine import CpuSplit, split_cpus
        self.assertIsNone(split_cpus({3}), "one CPU: nothing to split")
        self.assertEqual(split_cpus({0, 1}), CpuSplit(here=frozenset({0}), other=frozenset({1})))
        self.assertEqual(split_cpus({0, 1, 2, 5, 7}),
                         CpuSplit(here=frozenset({0, 1, 2}), other=frozenset({5, 7})))

    def test_a_process_is_pinned_with_all_its_threads(self):
        import subprocess
        from veilbench.othermachine import pin_process
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            self.skipTest("needs two CPUs")
        code = "import threading,time\n[threading.Thread(target=time.sleep,args=(30,)).start() for _ in range(3)]\ntime.sleep(30)"
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            deadline = time.monotonic() + 10
            while len(os.listdir(f"/proc/{proc.pid}/task")) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            pin_process(proc.pid, frozenset({cpus[-1]}))
            tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
            self.assertEqual(len(tids), 4)
            self.assertTrue(all(os.sched_getaffinity(t) == {cpus[-1]} for t in tids))
        finally:
            proc.kill()
            proc.wait()

    def test_the_measured_side_runs_on_its_cpus_and_gets_them_back(self):
        import subprocess
        from types import SimpleNamespace
        from veilbench import workloads
        from veilbench.othermachine import split_cpus
        cpus = split_cpus()
        if cpus is None:
            self.skipTest("needs two CPUs")
        before = os.sched_getaffinity(0)
        daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            ctx = SimpleNamespace(mount=SimpleNamespace(pid=daemon.pid))
            with self.assertRaises(RuntimeError):
                with workloads._on_this_machine(ctx, cpus):
                    self.assertEqual(os.sched_getaffinity(0), cpus.here)
                    self.assertEqual(os.sched_getaffinity(daemon.pid), cpus.here)
                    raise RuntimeError("a step failed")
            self.assertEqual(os.sched_getaffinity(0), before)
            self.assertEqual(os.sched_getaffinity(daemon.pid), before)
        finally:
            daemon.kill()
            daemon.wait()

    @staticmethod
    def _changes(status: Path) -> int:
        from veilbench.othermachine import OtherMachine
        return OtherMachine.changes(SimpleNamespace(status=status))


if __name__ == "__main__":
    unittest.main()
