"""Mount-table helpers that never touch the mounted filesystem itself.

``os.path.ismount`` calls ``stat`` on the mount point, which blocks forever
when a FUSE daemon is wedged.  Everything here reads ``/proc/self/mountinfo``
instead, and unmounting escalates from a normal unmount to aborting the FUSE
connection (``/sys/fs/fuse/connections/N/abort``) and a lazy unmount, so a
hung daemon can always be got rid of.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from .proc import StepError, run


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _canonical(path: Path) -> str:
    """Absolute path with symlinks resolved in the *parent* only: resolving
    the path itself would stat the mount point and hang on a dead daemon."""
    path = Path(os.path.abspath(path))
    return str(path.parent.resolve(strict=False) / path.name)


def mount_entry(path: Path) -> dict | None:
    """The last mountinfo entry whose mount point is *path*, or None."""
    target = _canonical(path)
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if _unescape(fields[4]) == target:
            fstype, source = (right.split() + ["", ""])[:2]
            found = {"dev": fields[2], "fstype": fstype, "source": _unescape(source)}
    return found


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below *path*."""
    root = _canonical(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if point == root or point.startswith(root + "/"):
            found.append(point)
    return found


def is_mounted(path: Path) -> bool:
    return mount_entry(path) is not None


def wait_mounted(path: Path, timeout: float, proc: subprocess.Popen | None = None,
                 log: Path | None = None) -> None:
    """Wait until *path* is a mount point.  If the launching process *proc*
    dies first, fail immediately with its log instead of waiting out the
    timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_mounted(path):
            return
        if proc is not None and proc.poll() is not None:
            detail = log.read_text(errors="replace").strip()[-400:] if log and log.exists() else ""
            raise StepError(f"daemon exited {proc.returncode} before the mount appeared: {detail}")
        time.sleep(0.05)
    raise StepError(f"mount did not appear at {path} within {timeout:.0f} s")


def abort_fuse_connection(path: Path) -> bool:
    """Abort the FUSE connection behind *path*; pending requests fail with
    ENOTCONN, so processes stuck on it wake up.  Returns True if aborted."""
    entry = mount_entry(path)
    if not entry or not entry["fstype"].startswith("fuse"):
        return False
    minor = entry["dev"].split(":")[1]
    abort = Path(f"/sys/fs/fuse/connections/{minor}/abort")
    try:
        abort.write_text("1")
        return True
    except OSError:
        return False


def force_unmount(path: Path, timeout: float = 30) -> bool:
    """Unmount *path* by path, escalating until it is gone (or raising).

    A polite unmount gets a short time (it hangs if the daemon is stopped
    or wedged); then the FUSE connection is aborted, which fails every
    pending request, and the unmount is retried, lazily as a last resort.
    Returns True if the polite unmount worked (the daemon is alive and can
    be given time to exit), False if force was needed."""
    path = Path(path)
    polite = min(timeout, 15)
    clean = True
    for argv in (["umount", str(path)], ["umount", str(path)], ["umount", "-l", str(path)]):
        if not is_mounted(path):
            return clean
        try:
            run(argv, timeout=polite)
        except StepError:
            clean = False
            abort_fuse_connection(path)
    if is_mounted(path):
        raise StepError(f"could not unmount {path}")
    return clean
