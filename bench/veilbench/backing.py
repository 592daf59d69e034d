"""Backing stores: where the ciphertext (or plain files) of each run lives.

Two are measured, as in the classic write-ups:

* ``tmpfs`` -- a size-capped tmpfs mounted by the driver.  Storage costs next
  to nothing, so the numbers show each filesystem's own CPU and FUSE cost.
* ``disk`` -- a directory under /var/tmp on the root disk.  This is what a
  user sees, including write-back and the device.

A backing is set up once per run and handed out as fresh, empty
subdirectories (one per mount), which are deleted right after use.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .mounts import force_unmount, is_mounted
from .proc import Cleanup, run


class Backing:
    name = "?"
    description = ""

    def __init__(self) -> None:
        self.root: Path | None = None
        self._count = 0

    def setup(self, run_dir: Path, cleanup: Cleanup) -> None:
        raise NotImplementedError

    def fresh_dir(self, label: str) -> Path:
        """A new empty directory on this backing, unique within the run."""
        self._count += 1
        path = self.root / f"{self._count:04d}-{label}"
        path.mkdir()
        return path

    def describe(self) -> dict:
        return {"name": self.name, "description": self.description, "root": str(self.root)}


class TmpfsBacking(Backing):
    name = "tmpfs"

    def __init__(self, size: str) -> None:
        super().__init__()
        self.size = size
        self.description = f"tmpfs, size={size} (RAM: measures the filesystem's own cost)"

    def setup(self, run_dir: Path, cleanup: Cleanup) -> None:
        self.root = run_dir / "backing-tmpfs"
        self.root.mkdir()
        cleanup.push(f"rmdir {self.root}", lambda: self.root.rmdir())
        run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755",
             "veilbench-backing", str(self.root)], timeout=30)
        cleanup.push(f"umount {self.root}", lambda: force_unmount(self.root))


class DiskBacking(Backing):
    name = "disk"

    def __init__(self, parent: Path) -> None:
        super().__init__()
        self.parent = parent
        self.description = f"directory under {parent} on the root disk"

    def setup(self, run_dir: Path, cleanup: Cleanup) -> None:
        self.parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="veilbench-disk-", dir=self.parent))
        cleanup.push(f"rm -r {self.root}", lambda: remove_tree(self.root))
        fs = run(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "-T", str(self.root)],
                 timeout=10, check=False).stdout.decode().strip()
        if fs:
            self.description += f" ({fs})"


def remove_tree(path: Path) -> None:
    """Delete *path*, refusing to descend into anything still mounted."""
    if not path.exists():
        return
    if is_mounted(path):
        force_unmount(path)
    shutil.rmtree(path, ignore_errors=False)


def make(name: str, tmpfs_size: str, disk_parent: Path) -> Backing:
    if name == "tmpfs":
        return TmpfsBacking(tmpfs_size)
    if name == "disk":
        return DiskBacking(disk_parent)
    raise ValueError(f"unknown backing store {name!r} (known: tmpfs, disk)")


BACKINGS = ("tmpfs", "disk")
