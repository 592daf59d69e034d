"""Deterministic inputs for the workloads.

The classic extract benchmark untars linux-3.0 (about 37k files, 430 MB).
There is no internet here, so an equivalent tree is cut from Debian's
``linux-source-6.1`` package: the whole source *minus* ``Documentation/`` and
``drivers/`` (about 38k files, 420 MB), repacked with ``tar --sort=name``,
a fixed mtime and root ownership and compressed with ``gzip -n``, so the same
package version always yields byte-identical tarballs.  The result is cached
(``--cache-dir``) with a manifest recording the package version and SHA-256
sums of the input and the output; a cached tarball whose checksum no longer
matches is rebuilt.

Everything a workload copies *from* lives on a separate RAM-backed "source"
tmpfs, so the reading side of a copy never limits the filesystem under test
(the German shoot-out copied from a RAM disk for the same reason).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import string
from dataclasses import dataclass
from pathlib import Path

from .proc import run

KERNEL_SOURCE = Path("/usr/src/linux-source-6.1.tar.xz")
KERNEL_PACKAGE = "linux-source-6.1"
KERNEL_TOP = "linux-source-6.1"
KERNEL_EXCLUDE = ("Documentation", "drivers")
TREE_NAME = "linux"
FIXED_MTIME = "2011-07-21 00:00:00 UTC"   # linux-3.0's release week
TARBALL = "linux-6.1-bench.tar.gz"
MANIFEST_VERSION = 1


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_version(name: str) -> str:
    res = run(["dpkg-query", "-W", "-f", "${Version}", name], timeout=30, check=False)
    return res.stdout.decode().strip()


# The build workload: perf from the kernel tree, with the optional features
# that depend on which -dev packages happen to be installed switched off, so
# the amount of code compiled is the same on every machine.
PERF_MEMBERS = ("tools", "include/uapi", "arch/x86/include/uapi")
PERF_MAKE_FLAGS = ("NO_LIBPYTHON=1", "NO_LIBPERL=1", "NO_SLANG=1", "NO_GTK2=1",
                   "NO_LIBNUMA=1", "NO_LIBAUDIT=1", "NO_LIBUNWIND=1", "NO_LIBBABELTRACE=1",
                   "NO_LIBCRYPTO=1", "NO_LIBZSTD=1", "NO_LIBCAP=1", "NO_JVMTI=1", "NO_LZMA=1",
                   "NO_AUXTRACE=1", "NO_LIBBPF=1", "NO_LIBDW_DWARF_UNWIND=1", "NO_DEMANGLE=1")
BUILD_PACKAGES = ("make", "gcc", "flex", "bison", "libelf-dev", "zlib1g-dev")


@dataclass
class BuildProject:
    """Sources to unpack (members of a tarball) and the command that builds
    them, run from the mount's root."""
    tarball: Path
    members: list
    command: list
    description: str


@dataclass
class Tree:
    """An extracted-tree dataset: a tarball to untar (``tar xf``), the name
    of its top directory, an ``md5sum -c`` list relative to the tarball's
    root, and what it holds."""
    tarball: Path
    top: str
    md5_list: Path
    files: int
    bytes: int
    description: str


def pack_deterministic(parent: Path, top: str, out_tar: Path) -> None:
    """tar *parent*/*top* so the archive depends only on file contents,
    names and permission bits."""
    run(["tar", "--sort=name", f"--mtime={FIXED_MTIME}", "--owner=0", "--group=0",
         "--numeric-owner", "--format=gnu", "-C", str(parent), "-cf", str(out_tar), top],
        timeout=1200)


def write_md5_list(parent: Path, top: str, out: Path) -> tuple[int, int]:
    """md5sum of every regular file under *top*, sorted; returns (files, bytes)."""
    paths = sorted(str(p.relative_to(parent)) for p in (parent / top).rglob("*")
                   if p.is_file() and not p.is_symlink())
    total = sum((parent / p).stat().st_size for p in paths)
    lines = []
    for chunk_start in range(0, len(paths), 2000):
        chunk = paths[chunk_start:chunk_start + 2000]
        lines.append(run(["md5sum", "--", *chunk], cwd=parent, timeout=600).stdout.decode())
    out.write_text("".join(lines))
    return len(paths), total


class Datasets:
    """Builds (once per run) and hands out the inputs of the workloads."""

    def __init__(self, cache_dir: Path, source_dir: Path, quick: bool, log) -> None:
        self.cache_dir = cache_dir
        self.source_dir = source_dir
        self.quick = quick
        self.log = log
        self._tree: Tree | None = None
        self._rsync_dest: Path | None = None
        self.notes: dict = {}

    # ------------------------------------------------------------ trees
    def tree(self) -> Tree:
        if self._tree is None:
            self._tree = self._synthetic_tree() if self.quick else self._kernel_tree()
        return self._tree

    def _kernel_tree(self) -> Tree:
        tgz, manifest = self._cached_kernel_tarball()
        tar = self.source_dir / "linux.tar"
        run(f"gzip -dc '{tgz}' > '{tar}'", timeout=600)
        md5 = self.source_dir / "linux.md5"
        shutil.copyfile(self.cache_dir / "linux.md5", md5)
        self.notes["kernel_tree"] = manifest
        return Tree(tarball=tar, top=TREE_NAME, md5_list=md5, files=manifest["files"],
                    bytes=manifest["bytes"], description=manifest["description"])

    def _cached_kernel_tarball(self) -> tuple[Path, dict]:
        """The cached tarball and its manifest, rebuilt when missing, stale
        (different source package) or corrupt (checksum mismatch)."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tgz = self.cache_dir / TARBALL
        mpath = self.cache_dir / "linux-6.1-bench.json"
        if not KERNEL_SOURCE.exists():
            run(["apt-get", "install", "-y", "-q", KERNEL_PACKAGE], timeout=1800,
                env={"DEBIAN_FRONTEND": "noninteractive"})
        version = package_version(KERNEL_PACKAGE)
        if tgz.exists() and mpath.exists() and (self.cache_dir / "linux.md5").exists():
            manifest = json.loads(mpath.read_text())
            if (manifest.get("manifest_version") == MANIFEST_VERSION
                    and manifest.get("package_version") == version
                    and sha256(tgz) == manifest.get("tarball_sha256")):
                return tgz, manifest
            self.log("cached kernel tarball is stale or corrupt; rebuilding")
        return tgz, self._build_kernel_tarball(tgz, mpath, version)

    def _build_kernel_tarball(self, tgz: Path, mpath: Path, version: str) -> dict:
        self.log(f"building the kernel-tree tarball from {KERNEL_SOURCE} (once; cached)")
        work = self.source_dir / "kernel-build"
        work.mkdir()
        try:
            excludes = [f"--exclude={KERNEL_TOP}/{d}" for d in KERNEL_EXCLUDE]
            run(["tar", "-xJf", str(KERNEL_SOURCE), "-C", str(work), *excludes], timeout=1200)
            (work / KERNEL_TOP).rename(work / TREE_NAME)
            files, size = write_md5_list(work, TREE_NAME, self.cache_dir / "linux.md5")
            tar = work / "linux.tar"
            pack_deterministic(work, TREE_NAME, tar)
            run(f"gzip -n -6 -c '{tar}' > '{tgz}.tmp' && mv '{tgz}.tmp' '{tgz}'", timeout=1200)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "package": KERNEL_PACKAGE,
            "package_version": version,
            "source": str(KERNEL_SOURCE),
            "source_sha256": sha256(KERNEL_SOURCE),
            "excluded_top_dirs": list(KERNEL_EXCLUDE),
            "tar_options": f"--sort=name --mtime='{FIXED_MTIME}' --owner=0 --group=0 "
                           "--numeric-owner --format=gnu; gzip -n -6",
            "files": files,
            "bytes": size,
            "tarball": TARBALL,
            "tarball_sha256": sha256(tgz),
            "description": (f"{KERNEL_PACKAGE} {version} without "
                            f"{', '.join(d + '/' for d in KERNEL_EXCLUDE)}: "
                            f"{files} files, {size / 1e6:.0f} MB"),
        }
        mpath.write_text(json.dumps(manifest, indent=2) + "\n")
        return manifest

    def _synthetic_tree(self) -> Tree:
        """Quick mode: a small source-like tree generated from a fixed seed,
        so smoke tests need neither the kernel package nor much time."""
        rng = random.Random(3)
        work = self.source_dir / "synthetic"
        top = work / TREE_NAME
        alphabet = string.ascii_lowercase + string.digits + "_"
        for d in range(20):
            sub = top / f"dir{d:02d}" / f"sub{d % 4}"
            sub.mkdir(parents=True)
            for i in range(40):
                name = "".join(rng.choice(alphabet) for _ in range(rng.randint(4, 14))) + ".c"
                size = int(rng.lognormvariate(8.5, 1.2))
                (sub / f"{i:03d}_{name}").write_bytes(rng.randbytes(size))
        md5 = self.source_dir / "linux.md5"
        files, size = write_md5_list(work, TREE_NAME, md5)
        tar = self.source_dir / "linux.tar"
        pack_deterministic(work, TREE_NAME, tar)
        shutil.rmtree(work)
        self.notes["kernel_tree"] = {"description": f"synthetic tree (quick mode): {files} files"}
        return Tree(tarball=tar, top=TREE_NAME, md5_list=md5, files=files, bytes=size,
                    description=f"synthetic tree: {files} files, {size / 1e6:.1f} MB")

    def rsync_destination(self) -> Path:
        """An almost up-to-date copy of the tree for ``rsync -an``: every 50th
        file removed and every 37th file's mtime changed, so rsync mostly
        compares metadata and finds a little to do."""
        if self._rsync_dest is None:
            dest = self.source_dir / "rsync-dest"
            dest.mkdir()
            run(["tar", "xf", str(self.tree().tarball), "-C", str(dest)], timeout=1200)
            files = sorted(p for p in (dest / TREE_NAME).rglob("*") if p.is_file())
            for i, p in enumerate(files):
                if i % 50 == 0:
                    p.unlink()
                elif i % 37 == 0:
                    os.utime(p, (0, 0))
            self._rsync_dest = dest
        return self._rsync_dest

    def git_repo(self) -> Path:
        """A bare git repository whose one commit is the whole tree (the
        kernel tree: 38k files), made once per run on the source tmpfs, for
        ``git status`` in a checkout of it.  Files are added with ``-f``: the
        Debian kernel tree's top ``.gitignore`` ignores everything at its top
        level (``/*``, for Debian's packaging repository)."""
        bare = self.source_dir / "tree.git"
        if not bare.exists():
            work = self.source_dir / "git-work"
            if work.exists():
                shutil.rmtree(work)   # a failed attempt of an earlier group
            work.mkdir()
            run(["tar", "xf", str(self.tree().tarball), "-C", str(work)], timeout=1200)
            git = ["git", "-c", "safe.directory=*", "-c", "user.name=veilbench",
                   "-c", "user.email=veilbench@localhost", "-C", str(work)]
            run([*git, "init", "-q"], timeout=60)
            run([*git, "add", "-A", "-f"], timeout=1200)
            run([*git, "commit", "-q", "-m", "tree"], timeout=1200)
            run(["git", "clone", "-q", "--bare", str(work), str(bare)], timeout=1200)
            shutil.rmtree(work)
        return bare

    # ------------------------------------------------------------ files
    def random_file(self, name: str, size: int) -> Path:
        path = self.source_dir / name
        if not path.exists():
            run(f"head -c {size} /dev/urandom > '{path}'", timeout=600)
        return path

    def many_files(self, count: int, size: int) -> Path:
        """*count* files of *size* random bytes with random 16-char names
        (fixed seed: same names every run)."""
        path = self.source_dir / f"many-{count}x{size}"
        if not path.exists():
            rng = random.Random(5)
            path.mkdir()
            alphabet = string.ascii_letters + string.digits
            blob = self.random_file("random-blob", 64 << 20).read_bytes()
            for _ in range(count):
                name = "".join(rng.choice(alphabet) for _ in range(16))
                off = rng.randrange(0, len(blob) - size)
                (path / name).write_bytes(blob[off:off + size])
        return path

    def mixed_folder(self, total: int) -> Path:
        """Files from 4 KiB to 32 MiB (log-uniform sizes, fixed seed) in a few
        subdirectories, adding up to about *total* bytes -- a photo/music
        folder rather than a source tree."""
        path = self.source_dir / f"mixed-{total}"
        if not path.exists():
            rng = random.Random(7)
            blob = self.random_file("random-blob", 64 << 20).read_bytes()
            written = 0
            i = 0
            while written < total:
                size = int(2 ** rng.uniform(12, 25))
                sub = path / f"album{i % 8}"
                sub.mkdir(parents=True, exist_ok=True)
                off = rng.randrange(0, len(blob) - size)
                (sub / f"item{i:04d}.bin").write_bytes(blob[off:off + size])
                written += size
                i += 1
        return path

    def out_dir(self) -> Path:
        """A fresh, empty destination for copy-out steps (on the source tmpfs)."""
        path = self.source_dir / "out"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir()
        return path

    # ------------------------------------------------------------ build
    def build_project(self) -> "BuildProject":
        """The build workload's sources: ``perf`` from the kernel tree (a
        real ~1.5 minute build on 2 cores), or in quick mode a generated C
        project of a few dozen files."""
        if self.quick:
            return self._synthetic_c_project()
        tree = self.tree()
        return BuildProject(
            tarball=tree.tarball, members=[f"{TREE_NAME}/{m}" for m in PERF_MEMBERS],
            command=["make", "-s", "-j2", "-C", f"{TREE_NAME}/tools/perf", *PERF_MAKE_FLAGS],
            description="linux 6.1 tools/perf: make -j2 " + " ".join(PERF_MAKE_FLAGS))

    def _synthetic_c_project(self) -> "BuildProject":
        tar = self.source_dir / "cproject.tar"
        if not tar.exists():
            work = self.source_dir / "cproject-src"
            src = work / "cproject"
            src.mkdir(parents=True)
            units = 24
            for i in range(units):
                funcs = "\n".join(
                    f"int f{i}_{j}(int x) {{ int s = 0; for (int k = 0; k < x; k++) "
                    f"s += (k * {j + 3}) ^ (s >> {j % 7 + 1}); return s; }}" for j in range(60))
                (src / f"unit{i:02d}.c").write_text(f"#include <stdio.h>\n{funcs}\n")
            calls = " + ".join(f"f{i}_0(n)" for i in range(units))
            decls = "".join(f"int f{i}_0(int);\n" for i in range(units))
            (src / "main.c").write_text(f"{decls}int main(void) {{ int n = 3; return ({calls}) & 1; }}\n")
            (src / "Makefile").write_text(
                "OBJS := $(patsubst %.c,%.o,$(wildcard *.c))\n"
                "prog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n"
                "%.o: %.c\n\t$(CC) -O2 -c -o $@ $<\n")
            pack_deterministic(work, "cproject", tar)
            shutil.rmtree(work)
        return BuildProject(tarball=tar, members=["cproject"],
                            command=["make", "-s", "-j2", "-C", "cproject"],
                            description="generated C project (quick mode): 25 files, make -j2")
