"""The permission matrix of tests/posix.rs (permission_outcomes_match_tmpfs): objects of every
mode 0000-0777 (files and directories), sticky directories and set-id modes, owned by each
of the given (uid, gid) pairs, and the operations whose permission Linux checks, run on them.

    python3 perm_matrix.py setup DIR OWNERS_JSON [STRANGER_UID]
    python3 perm_matrix.py run DIR

`setup` makes the objects (as root it gives them to the owners; a user passes only itself).
`run` prints one line per operation, "CELL OP OUTCOME" (ok, yes/no for access(2), an errno
name, or the attributes read), and the final attributes of every object: the same run on a
tmpfs and on the mount must print the same lines.
"""

import errno
import json
import os
import sys

FILE_MODES = list(range(0o1000)) + [0o4755, 0o2755, 0o6777, 0o2745, 0o1755, 0o7000]
DIR_MODES = list(range(0o1000)) + [0o1777, 0o1770, 0o1707, 0o1733, 0o1700, 0o2775, 0o3777]
NS = 1_000_000_000


def cells(root):
    for name in sorted(os.listdir(os.path.join(root, "files"))):
        yield "f", name, os.path.join(root, "files", name)
    for name in sorted(os.listdir(os.path.join(root, "dirs"))):
        yield "d", name, os.path.join(root, "dirs", name)


def setup(root, owners, stranger):
    for sub in ("files", "dirs"):
        os.mkdir(os.path.join(root, sub))
        os.chmod(os.path.join(root, sub), 0o777)
    for i, (uid, gid) in enumerate(owners):
        for m in FILE_MODES:
            p = os.path.join(root, "files", f"o{i}-{m:04o}")
            with open(p, "w") as f:
                f.write("x")
            os.setxattr(p, "user.k", b"v")
            os.chown(p, uid, gid)
            os.chmod(p, m)
        for m in DIR_MODES:
            d = os.path.join(root, "dirs", f"o{i}-{m:04o}")
            os.mkdir(d)
            os.setxattr(d, "user.k", b"v")
            # In a sticky directory the victims belong to a third user (when root sets up).
            child_uid, child_gid = (stranger, stranger) if m & 0o1000 and stranger is not None else (uid, gid)
            for c in ("f", "g"):
                with open(os.path.join(d, c), "w") as f:
                    f.write("x")
                os.chown(os.path.join(d, c), child_uid, child_gid)
            os.mkdir(os.path.join(d, "e"))
            os.chown(os.path.join(d, "e"), child_uid, child_gid)
            os.chown(d, uid, gid)
            os.chmod(d, m)


def attempt(out, cell, op, f):
    try:
        r = f()
        out.append(f"{cell} {op} {'ok' if r is None else r}")
    except OSError as e:
        out.append(f"{cell} {op} {errno.errorcode.get(e.errno, e.errno)}")


def opened(p, flags, mode=0o644):
    def go():
        os.close(os.open(p, flags, mode))
    return go


def access(p, mask):
    return lambda: "yes" if os.access(p, mask) else "no"


def attrs(p):
    st = os.lstat(p)
    return f"{st.st_mode:o}:{st.st_uid}:{st.st_gid}:{st.st_size if not os.path.isdir(p) else '-'}"


def file_ops(out, cell, p, me):
    uid, gid = me
    ops = [
        ("read", opened(p, os.O_RDONLY)),
        ("write", opened(p, os.O_WRONLY)),
        ("rdwr", opened(p, os.O_RDWR)),
        ("access-r", access(p, os.R_OK)),
        ("access-w", access(p, os.W_OK)),
        ("access-x", access(p, os.X_OK)),
        ("getxattr", lambda: os.getxattr(p, "user.k").decode()),
        ("setxattr", lambda: os.setxattr(p, "user.n", b"w")),
        ("removexattr", lambda: os.removexattr(p, "user.k")),
        ("utime-now", lambda: os.utime(p)),
        ("utime-set", lambda: os.utime(p, ns=(NS, 2 * NS))),
        ("truncate", lambda: os.truncate(p, 3)),
        ("open-trunc", opened(p, os.O_WRONLY | os.O_TRUNC)),
        ("chmod-same", lambda: os.chmod(p, os.lstat(p).st_mode & 0o7777)),
        ("chmod-setgid", lambda: os.chmod(p, (os.lstat(p).st_mode & 0o7777) | 0o2000)),
        ("chgrp-mine", lambda: os.chown(p, -1, gid)),
        ("chown-me", lambda: os.chown(p, uid, -1)),
    ]
    for op, f in ops:
        attempt(out, cell, op, f)


def dir_ops(out, cell, d, base):
    j = lambda n: os.path.join(d, n)

    def chdir():
        os.chdir(d)
        os.chdir(base)

    ops = [
        ("list", lambda: ",".join(sorted(os.listdir(d)))),
        ("stat-child", lambda: attrs(j("f"))),
        ("access-r", access(d, os.R_OK)),
        ("access-w", access(d, os.W_OK)),
        ("access-x", access(d, os.X_OK)),
        ("chdir", chdir),
        ("create", opened(j("new"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
        ("mkdir", lambda: os.mkdir(j("nd"))),
        ("symlink", lambda: os.symlink("t", j("sl"))),
        ("mkfifo", lambda: os.mkfifo(j("ff"))),
        ("link", lambda: os.link(j("f"), j("hl"))),
        ("rename", lambda: os.rename(j("g"), j("g2"))),
        ("rename-out", lambda: os.rename(j("f"), os.path.join(base, "dirs", cell + ".out"))),
        ("unlink", lambda: os.unlink(j("f"))),
        ("rmdir", lambda: os.rmdir(j("e"))),
        ("getxattr", lambda: os.getxattr(d, "user.k").decode()),
        ("setxattr", lambda: os.setxattr(d, "user.n", b"w")),
        ("utime-now", lambda: os.utime(d)),
        ("utime-set", lambda: os.utime(d, ns=(NS, 2 * NS))),
        ("chmod-same", lambda: os.chmod(d, os.lstat(d).st_mode & 0o7777)),
    ]
    for op, f in ops:
        attempt(out, cell, op, f)


def run(root):
    me = (os.getuid(), os.getgid())
    out = []
    for kind, cell, p in cells(root):
        if kind == "f":
            file_ops(out, "f" + cell, p, me)
        else:
            dir_ops(out, "d" + cell, p, root)
    for kind, cell, p in cells(root):
        attempt(out, kind + cell, "attrs", lambda: attrs(p))
    print("\n".join(out))


if __name__ == "__main__":
    if sys.argv[1] == "setup":
        stranger = int(sys.argv[4]) if len(sys.argv) > 4 else None
        setup(sys.argv[2], json.loads(sys.argv[3]), stranger)
    else:
        run(sys.argv[2])
