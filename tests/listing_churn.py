"""A directory listed in small getdents64 chunks while it changes (tests/mount.rs,
a_directory_listed_while_it_changes_returns_each_unchanged_name_exactly_once).

usage: listing_churn.py DIR   (DIR must not exist; prints "ok" or what went wrong)"""
import ctypes
import os
import platform
import sys

SYS_GETDENTS64 = {"x86_64": 217, "aarch64": 61}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)


def chunk(fd, size=1024):
    buf = ctypes.create_string_buffer(size)
    n = libc.syscall(SYS_GETDENTS64, fd, buf, size)
    if n < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    out, off = [], 0
    while off < n:
        reclen = int.from_bytes(buf.raw[off + 16:off + 18], "little")
        name = buf.raw[off + 19:off + reclen].split(b"\0", 1)[0].decode()
        if name not in (".", ".."):
            out.append(name)
        off += reclen
    return out, n


def rest(fd):
    out = []
    while True:
        names, n = chunk(fd)
        if n == 0:
            return out
        out += names


def check(what, got, must, may=()):
    errors = []
    dups = sorted({n for n in got if got.count(n) > 1})
    if dups:
        errors.append(f"{what}: {len(dups)} names came twice, e.g. {dups[:3]}")
    missing = sorted(set(must) - set(got))
    if missing:
        errors.append(f"{what}: {len(missing)} names there throughout are missing, e.g. {missing[:3]}")
    extra = sorted(set(got) - set(must) - set(may))
    if extra:
        errors.append(f"{what}: {len(extra)} names never there, e.g. {extra[:3]}")
    return errors


d = sys.argv[1]
os.mkdir(d)
first = [f"f{i:04}" for i in range(3000)]
for n in first:
    open(os.path.join(d, n), "w").close()
fd1 = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
seen = []
for _ in range(5):
    seen += chunk(fd1)[0]
unseen = sorted(set(first) - set(seen))
gone = set(seen[::7]) | set(unseen[::17])
for n in gone:
    os.unlink(os.path.join(d, n))
added = [f"new{i:03}" for i in range(150)]
for n in added:
    open(os.path.join(d, n), "w").close()
# A second listing from the top while the first is half way: sees exactly the directory now.
fd2 = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
now = sorted(set(first) - gone) + added
errors = check("second listing", rest(fd2), now)
os.close(fd2)
gone2 = set(unseen[5::23]) - gone
for n in gone2:
    os.unlink(os.path.join(d, n))
errors += check("first listing", seen + rest(fd1), sorted(set(first) - gone - gone2), gone | gone2 | set(added))
os.close(fd1)
print("\n".join(errors) if errors else "ok")
