#!/usr/bin/env python3
"""Independent reference reader for the veilfs on-disk format, version 1.

Written from docs/FORMAT.md alone (section numbers below refer to it), not from the Rust
code, so that it checks the document as much as the implementation. It needs only the
`cryptography` package (>= 44, for Argon2id): XChaCha20-Poly1305 is built here from a
pure-Python HChaCha20 and `cryptography`'s ChaCha20-Poly1305.

    python3 tests/vectors/reference_reader.py --vectors tests/vectors/v1.json
    python3 tests/vectors/reference_reader.py --vault DIR --password-file F [--compare SRC]
    python3 tests/vectors/reference_reader.py --vault DIR --recovery-key-file F [--compare SRC]
    python3 tests/vectors/reference_reader.py --vault DIR --password-file F --tamper-selftest

Exit status 0 when every check passed; the last line is "N passed, N failed".
"""

from __future__ import annotations

import argparse
import hashlib
import hmac as std_hmac
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESGCMSIV, AESSIV, ChaCha20Poly1305
    from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError as e:  # pragma: no cover
    sys.exit(f"reference_reader: needs the 'cryptography' package >= 44 (pip install cryptography): {e}")


class IntegrityError(Exception):
    """Ciphertext failed authentication or is structurally invalid (tampered or damaged)."""


class ConfigError(Exception):
    """The config is malformed, of another version, or failed its MAC."""


class WrongSecret(Exception):
    """No key slot accepted the password or recovery key."""


# ---------------------------------------------------------------- §1 primitives

B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_B64_SET = frozenset(B64_ALPHABET)


def b64(data: bytes) -> str:
    """base64url without padding (§1)."""
    out = []
    for i in range(0, len(data), 3):
        chunk = data[i : i + 3]
        n = int.from_bytes(chunk + b"\0" * (3 - len(chunk)), "big")
        chars = [B64_ALPHABET[(n >> s) & 63] for s in (18, 12, 6, 0)]
        out.append("".join(chars[: len(chunk) + 1]))
    return "".join(out)


def unb64(s: str) -> bytes:
    """Strict base64url decoding (§1): no padding, alphabet only, len mod 4 != 1, zero trailing bits."""
    if not isinstance(s, str) or any(c not in _B64_SET for c in s) or len(s) % 4 == 1:
        raise ValueError("not canonical base64url")
    acc, bits, out = 0, 0, bytearray()
    for c in s:
        acc = (acc << 6) | B64_ALPHABET.index(c)
        bits += 6
        if bits >= 8:
            bits -= 8
            out.append((acc >> bits) & 0xFF)
    if acc & ((1 << bits) - 1):
        raise ValueError("non-zero trailing bits in base64url")
    return bytes(out)


def hkdf(salt: bytes, ikm: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def hmac256(key: bytes, msg: bytes) -> bytes:
    return std_hmac.new(key, msg, hashlib.sha256).digest()


def siv_encrypt(key: bytes, ad: list[bytes], plaintext: bytes) -> bytes:
    return AESSIV(key).encrypt(plaintext, ad)


def siv_decrypt(key: bytes, ad: list[bytes], data: bytes) -> bytes:
    try:
        return AESSIV(key).decrypt(data, ad)
    except (InvalidTag, ValueError) as e:
        raise IntegrityError("AES-SIV authentication failed") from e


def _rotl32(v: int, c: int) -> int:
    return ((v << c) & 0xFFFFFFFF) | (v >> (32 - c))


def hchacha20(key: bytes, nonce16: bytes) -> bytes:
    """HChaCha20 (draft-irtf-cfrg-xchacha-03 §2.2): the XChaCha20 subkey."""
    st = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574]
    st += list(struct.unpack("<8I", key)) + list(struct.unpack("<4I", nonce16))

    def qr(a, b, c, d):
        st[a] = (st[a] + st[b]) & 0xFFFFFFFF; st[d] = _rotl32(st[d] ^ st[a], 16)
        st[c] = (st[c] + st[d]) & 0xFFFFFFFF; st[b] = _rotl32(st[b] ^ st[c], 12)
        st[a] = (st[a] + st[b]) & 0xFFFFFFFF; st[d] = _rotl32(st[d] ^ st[a], 8)
        st[c] = (st[c] + st[d]) & 0xFFFFFFFF; st[b] = _rotl32(st[b] ^ st[c], 7)

    for _ in range(10):
        qr(0, 4, 8, 12); qr(1, 5, 9, 13); qr(2, 6, 10, 14); qr(3, 7, 11, 15)
        qr(0, 5, 10, 15); qr(1, 6, 11, 12); qr(2, 7, 8, 13); qr(3, 4, 9, 14)
    return struct.pack("<8I", *(st[0:4] + st[12:16]))


class ContentAead:
    """The content AEADs of §1 and §17 (AES-256-GCM-SIV), with their nonce lengths."""

    def __init__(self, name: str):
        if name not in ("AES-256-GCM", "XChaCha20-Poly1305", "AES-256-GCM-SIV"):
            raise ConfigError(f"unknown cipher {name!r}")
        self.name = name
        self.nonce_len = 24 if name == "XChaCha20-Poly1305" else 12
        self.overhead = self.nonce_len + 16

    def _seal_or_open(self, key: bytes, nonce: bytes, aad: bytes, data: bytes, seal: bool) -> bytes:
        if self.name == "AES-256-GCM":
            c, n = AESGCM(key), nonce
        elif self.name == "AES-256-GCM-SIV":
            c, n = AESGCMSIV(key), nonce
        else:
            c, n = ChaCha20Poly1305(hchacha20(key, nonce[:16])), b"\0\0\0\0" + nonce[16:24]
        return c.encrypt(n, data, aad) if seal else c.decrypt(n, data, aad)

    def seal(self, key: bytes, nonce: bytes, aad: bytes, plaintext: bytes) -> bytes:
        """nonce ‖ ciphertext ‖ tag (§5.2)."""
        return nonce + self._seal_or_open(key, nonce, aad, plaintext, True)

    def open(self, key: bytes, aad: bytes, block: bytes) -> bytes:
        if len(block) <= self.overhead:
            raise IntegrityError(f"block of {len(block)} bytes is too short")
        try:
            return self._seal_or_open(key, block[: self.nonce_len], aad, block[self.nonce_len :], False)
        except InvalidTag as e:
            raise IntegrityError("block authentication failed") from e


# ---------------------------------------------------------------- §4 keys

SUBKEY_LABELS = {  # name -> (info, length)
    "content": (b"content", 32),
    "header": (b"header-mac", 32),
    "names": (b"names", 64),
    "binding": (b"name-binding", 64),
    "config_mac": (b"config-mac", 32),
    "xattr_names": (b"xattr-names", 64),
    "record_mac": (b"record-mac", 32),
}


def subkeys(master: bytes) -> dict[str, bytes]:
    return {k: hkdf(b"veilfs v1", master, info, n) for k, (info, n) in SUBKEY_LABELS.items()}


def file_key(keys: dict[str, bytes], file_id: bytes) -> bytes:
    return hkdf(file_id, keys["content"], b"file-content", 32)


# ---------------------------------------------------------------- §5 contents

HEADER_LEN = 36
FLAG_SPARSE = 0x0001
FLAG_UNSETTLED = 0x0002  # §5.8, only with the feature "unsettled-tails"
UNSETTLED_TAILS = "unsettled-tails"
# §5.8 with "ordered-growth": a full inner block does not end an unsettled file, the walk back
# passes complete inner blocks, passing slot 0 is an error, and an all-zero header is empty.
ORDERED_GROWTH = "ordered-growth"


def block_aad(file_id: bytes, n: int, last: bool) -> bytes:
    return file_id + struct.pack(">Q", n) + bytes([1 if last else 0])


def header_encode(keys, flags: int, file_id: bytes) -> bytes:
    body = struct.pack(">HH", 1, flags) + file_id
    return body + hmac256(keys["header"], b"veilfs v1 header" + body)[:16]


def header_decode(keys, data: bytes, unsettled_tails: bool = False) -> tuple[int, bytes]:
    """§5.1: tag first (constant time), then version, then flags. Returns (flags, file ID)."""
    if len(data) < HEADER_LEN:
        raise IntegrityError("file header truncated")
    tag = hmac256(keys["header"], b"veilfs v1 header" + data[:20])[:16]
    if not std_hmac.compare_digest(tag, data[20:36]):
        raise IntegrityError("file header authentication failed")
    version, flags = struct.unpack(">HH", data[:4])
    if version != 1:
        raise IntegrityError(f"unsupported header version {version}")
    if flags & ~(FLAG_SPARSE | (FLAG_UNSETTLED if unsettled_tails else 0)):
        raise IntegrityError(f"unknown header flags {flags:#x}")
    return flags, data[4:20]


def cipher_size(p: int, B: int, O: int) -> int:
    if p == 0:
        return 0
    rem = p % B
    return HEADER_LEN + (p // B) * (B + O) + (rem + O if rem else 0)


def plain_size(c: int, B: int, O: int) -> tuple[int, int]:
    """§5.3: (plaintext size, number of blocks), or IntegrityError for an impossible size."""
    if c == 0 or c == HEADER_LEN:
        return 0, 0  # a header alone is an empty file (a crash after a first write's header)
    if c < HEADER_LEN:
        raise IntegrityError(f"ciphertext of {c} bytes has no block after the header (truncated)")
    body = c - HEADER_LEN
    k = -(-body // (B + O))
    r = body - (k - 1) * (B + O)
    if r <= O:
        raise IntegrityError(f"final block of {r} bytes has no payload (truncated)")
    return body - k * O, k


# §5.10: the block map (feature "block-map"; every new vault). Layout, root, header
# v2, the settled file's reading rules (holes are zero leaves) and, below, an UNSETTLED file read
# by its write session's log.
H2 = 92
MAP_SPAN = 1 << 15  # S: blocks per span, a node after each span a block follows


def bm_group_of(n: int) -> int:
    if n == 0:
        return 0
    if n < 256:
        return n.bit_length()
    return n // 256 + 8


def bm_group_start(g: int) -> int:
    if g == 0:
        return 0
    if g <= 8:
        return 1 << (g - 1)
    return (g - 8) * 256


def bm_capacity(g: int) -> int:
    return bm_group_start(g + 1) - bm_group_start(g)


def bm_groups(k: int) -> int:
    return 0 if k == 0 else bm_group_of(k - 1) + 1


def bm_nodes(k: int) -> int:
    return 0 if k == 0 else (k - 1) // MAP_SPAN


def bm_offset(n: int, B: int, O: int) -> int:
    return H2 + n * (B + O) + 16 * bm_group_start(bm_group_of(n) + 1) + 32 * bm_group_of((n // MAP_SPAN) * MAP_SPAN)


def bm_map_offset(g: int, B: int, O: int) -> int:
    return bm_offset(bm_group_start(g), B, O) - 16 * bm_capacity(g)


def bm_node_offset(j: int, B: int, O: int) -> int:
    return bm_offset((j + 1) * MAP_SPAN - 1, B, O) + B + O


def bm_node_len(j: int) -> int:
    return 32 * (bm_group_of((j + 1) * MAP_SPAN) - bm_group_of(j * MAP_SPAN))


def bm_map_len(g: int, k: int) -> int:
    return 16 * max(0, min(bm_group_start(g + 1), k) - bm_group_start(g))


def bm_cipher_size(p: int, B: int, O: int) -> int:
    if p == 0:
        return 0
    k = -(-p // B)
    return bm_offset(k - 1, B, O) + (p - (k - 1) * B) + O


def bm_plain_size(c: int, B: int, O: int) -> tuple[int, int]:
    """(p, k) from a ciphertext size, or IntegrityError for an impossible one."""
    if c in (0, H2):
        return 0, 0
    if c < H2:
        raise IntegrityError(f"ciphertext of {c} bytes is cut inside the header")
    if bm_offset(0, B, O) >= c:
        raise IntegrityError(f"ciphertext of {c} bytes ends inside map block 0")
    lo, hi = 0, 1
    while bm_offset(hi, B, O) < c:  # the largest n with offset(n) < c lies in [lo, hi)
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if bm_offset(mid, B, O) < c else (lo, mid)
    r = c - bm_offset(lo, B, O)
    if r <= O or r > B + O:
        raise IntegrityError(f"ciphertext of {c} bytes ends inside map data or a block with no payload")
    return lo * B + r - O, lo + 1


def bm_root(fid: bytes, k: int, map_blocks: list[bytes]) -> bytes:
    """§5.10: one hash per stored node (the hashes of its span's map blocks), then one per map
    block of the last span."""
    assert len(map_blocks) == bm_groups(k)
    hashes = [hashlib.sha256(m).digest() for m in map_blocks]
    J = bm_nodes(k)
    items = [hashlib.sha256(b"".join(hashes[bm_group_of(j * MAP_SPAN):bm_group_of((j + 1) * MAP_SPAN)])).digest()
             for j in range(J)]
    items += hashes[bm_group_of(J * MAP_SPAN):]
    return hashlib.sha256(b"veilfs v2 map" + fid + struct.pack(">Q", k) + b"".join(items)).digest()


def bm_map_blocks(leaves: list[bytes]) -> list[bytes]:
    k = len(leaves)
    return [b"".join(leaves[bm_group_start(g):min(bm_group_start(g + 1), k)]) for g in range(bm_groups(k))]


def header_v2_encode(keys, flags: int, fid: bytes, generation: int, writer: bytes, k: int, root: bytes) -> bytes:
    body = struct.pack(">HH", 2, flags) + fid + struct.pack(">Q", generation) + writer + struct.pack(">Q", k) + root
    return body + hmac256(keys["header"], b"veilfs v2 header" + body)[:16]


def header_v2_decode(keys, data: bytes) -> dict:
    """§5.10: tag first (constant time), then version, then flags."""
    if len(data) < H2:
        raise IntegrityError("header v2 truncated")
    tag = hmac256(keys["header"], b"veilfs v2 header" + data[:76])[:16]
    if not std_hmac.compare_digest(tag, data[76:92]):
        raise IntegrityError("header v2 authentication failed")
    version, flags = struct.unpack(">HH", data[:4])
    if version != 2:
        raise IntegrityError(f"unsupported header version {version}")
    if flags & ~(FLAG_SPARSE | FLAG_UNSETTLED):
        raise IntegrityError(f"unknown header flags {flags:#x}")
    generation, = struct.unpack(">Q", data[20:28])
    k, = struct.unpack(">Q", data[36:44])
    return {"flags": flags, "file_id": data[4:20], "generation": generation, "writer": data[28:36], "blocks": k,
            "root": data[44:76]}


def read_block_map_file(aead, keys, B: int, data: bytes, identity: bytes, log: bytes | None = None) -> bytes:
    """A settled file with a block map: header, count, root over the stored map blocks, then each
    block's tag compared with its leaf and the block opened; a zero leaf is a hole (B zero bytes),
    never the final block. An all-zero header is an empty file (a first write cut before it). A
    header with UNSETTLED is read by its session's `log` (None: there is none)."""
    if len(data) == 0 or (len(data) >= H2 and data[:H2].count(0) == H2):
        return b""
    h = header_v2_decode(keys, data)
    if h["file_id"] != identity:
        raise IntegrityError("header ID differs from the entry's identity")
    if h["flags"] & FLAG_UNSETTLED:
        return read_unsettled_block_map_file(aead, keys, B, data, identity, h, log)
    O = aead.nonce_len + 16
    p, k = bm_plain_size(len(data), B, O)
    if k != h["blocks"]:
        raise IntegrityError(f"block count {h['blocks']} does not match a size of {k} blocks")
    maps = [data[bm_map_offset(g, B, O):][:bm_map_len(g, k)] for g in range(bm_groups(k))]
    stored = [data[bm_node_offset(j, B, O):][:bm_node_len(j)] for j in range(bm_nodes(k))]
    # Stored nodes must hold the hashes of their map blocks (the root covers them either way).
    for j, node in enumerate(stored):
        span = maps[bm_group_of(j * MAP_SPAN):bm_group_of((j + 1) * MAP_SPAN)]
        if node != b"".join(hashlib.sha256(m).digest() for m in span):
            raise IntegrityError(f"node {j} does not hold its map blocks' hashes")
    if not std_hmac.compare_digest(bm_root(identity, k, maps), h["root"]):
        raise IntegrityError("map root does not match the header")
    # A settled file has no log: a block that is not the map's version has no other source.
    return bm_read_blocks(aead, file_key(keys, identity), identity, B, data, p, maps, lambda n, leaf: None)


# §5.10 "Write sessions and their log": the log `veilfs.S.<b64(ID)>` of a session, and the rules
# for reading a file whose header v2 carries UNSETTLED.
LOG_HEAD = 40
LOG_READ_LIMIT = 64 << 20  # a reader looks at the log's first 64 MiB
LOG_LABEL = b"veilfs v2 session record"
REC_BLOCK, REC_MAP, REC_COMMIT, REC_SIZE, REC_COPY = 1, 2, 3, 4, 5
NODE_BIT = 1 << 63  # a map record's `a` for node j is 2^63 + j


def log_record_mac(keys, fid: bytes, g: int, kind: int, seq: int, a: int, payload: bytes) -> bytes | None:
    if kind == REC_MAP:
        d = hashlib.sha256(payload).digest()
    elif kind == REC_COPY:
        if len(payload) < 16:
            return None
        d = payload[-16:]
    else:
        d = payload
    msg = LOG_LABEL + fid + struct.pack(">QBQQI", g, kind, seq, a, len(payload)) + d
    return hmac256(keys["record_mac"], msg)[:16]


def log_record(keys, fid: bytes, g: int, kind: int, seq: int, a: int, payload: bytes) -> bytes:
    mac = log_record_mac(keys, fid, g, kind, seq, a, payload)
    return struct.pack(">B3xIQQ", kind, len(payload), seq, a) + mac + payload


def parse_log(keys, fid: bytes, g: int, log: bytes) -> list[dict]:
    """The records of session g of file `fid` whose MAC verifies, in the order of the log. The
    walk stops at a record cut short, of an unknown kind or with non-zero padding."""
    log, pos, out = log[:LOG_READ_LIMIT], 0, []
    while pos + LOG_HEAD <= len(log):
        kind, pad, length, seq, a = struct.unpack(">B3sIQQ", log[pos:pos + 24])
        if kind not in (REC_BLOCK, REC_MAP, REC_COMMIT, REC_SIZE, REC_COPY) or pad != bytes(3):
            break
        payload = log[pos + LOG_HEAD:pos + LOG_HEAD + length]
        if len(payload) < length:
            break
        mac = log_record_mac(keys, fid, g, kind, seq, a, payload)
        if mac is not None and std_hmac.compare_digest(mac, log[pos + 24:pos + 40]):
            out.append({"kind": kind, "seq": seq, "a": a, "payload": payload})
        pos += LOG_HEAD + length
    return out


def bm_block_count(p: int, B: int) -> int:
    return -(-p // B)


def bm_counts(p: int, B: int, O: int) -> bool:
    """Whether a size or commit record of p bytes counts: not 0 bytes (a truncate to 0 removes
    the log) and not more blocks than the limit of "Layout"."""
    return 0 < bm_block_count(p, B) <= (1 << 62) // (B + O + 64)


def bm_check_nodes(maps: list[bytes], nodes: list[bytes]):
    for j, node in enumerate(nodes):
        span = maps[bm_group_of(j * MAP_SPAN):bm_group_of((j + 1) * MAP_SPAN)]
        if node != b"".join(hashlib.sha256(m).digest() for m in span):
            raise IntegrityError(f"node {j} does not hold its map blocks' hashes")


def bm_read_blocks(aead, key, fid: bytes, B: int, data: bytes, p: int, maps: list[bytes], copies) -> bytes:
    """"Reading" step 4 for a file of p bytes with map blocks `maps`; a block whose stored tag
    is not its leaf is taken from `copies(n, leaf)` (None: an integrity error)."""
    O, k, out = aead.overhead, bm_block_count(p, B), []
    for n in range(k):
        g = bm_group_of(n)
        leaf = maps[g][16 * (n - bm_group_start(g)):][:16]
        block = data[bm_offset(n, B, O):][:(B if n < k - 1 else p - n * B) + O]
        if leaf == bytes(16):
            if n == k - 1:
                raise IntegrityError(f"block {n}, the final block, is a hole in the map")
            out.append(bytes(B))
            continue
        if block[-16:] != leaf:
            block = copies(n, leaf)
            if block is None:
                raise IntegrityError(f"block {n} is not the version the map commits to")
        out.append(aead.open(key, block_aad(fid, n, n == k - 1), block))
    return b"".join(out)


def read_unsettled_block_map_file(aead, keys, B: int, data: bytes, fid: bytes, h: dict, log: bytes | None) -> bytes:
    """A file whose header v2 carries UNSETTLED, read with the records of its session's log
    (generation g = the header's): by the newest commit record whose map gives its root, else by
    the header's map with the sizes and blocks the log vouches for. Newest means the highest seq,
    wherever a record lies in the log."""
    O, key = aead.overhead, file_key(keys, fid)
    recs = sorted(parse_log(keys, fid, h["generation"], log or b""), key=lambda r: r["seq"])
    newest_first = list(reversed(recs))

    def opens(n: int, last: bool, b: bytes) -> bytes | None:
        try:
            return aead.open(key, block_aad(fid, n, last), b)
        except IntegrityError:
            return None

    def copy_with_tag(n: int, length: int, last: bool, ok_tag) -> bytes | None:
        for r in newest_first:
            if (r["kind"] == REC_COPY and r["a"] == n and len(r["payload"]) == length and ok_tag(r["payload"][-16:])
                    and opens(n, last, r["payload"]) is not None):
                return r["payload"]
        return None

    # By a commit: the newest commit record whose map (map records before it, else the file's
    # bytes) gives its root.
    for c in newest_first:
        if c["kind"] != REC_COMMIT or len(c["payload"]) != 40:
            continue
        p1, root1 = struct.unpack(">Q", c["payload"][:8])[0], c["payload"][8:]
        if not bm_counts(p1, B, O):
            continue
        k1 = bm_block_count(p1, B)

        def region(a: int, off: int, length: int) -> bytes:
            for r in newest_first:
                if r["kind"] == REC_MAP and r["seq"] < c["seq"] and r["a"] == a and len(r["payload"]) == length:
                    return r["payload"]
            return data[off:off + length]

        maps = [region(g, bm_map_offset(g, B, O), bm_map_len(g, k1)) for g in range(bm_groups(k1))]
        nodes = [region(NODE_BIT + j, bm_node_offset(j, B, O), bm_node_len(j)) for j in range(bm_nodes(k1))]
        if not std_hmac.compare_digest(bm_root(fid, k1, maps), root1):
            continue
        bm_check_nodes(maps, nodes)
        return bm_read_blocks(aead, key, fid, B, data, p1, maps,
                              lambda n, leaf: copy_with_tag(n, (B if n < k1 - 1 else p1 - n * B) + O, n == k1 - 1,
                                                            lambda t: t == leaf))
    # Otherwise by the header's map, which must give the header's root.
    k0 = h["blocks"]
    maps = [data[bm_map_offset(g, B, O):][:bm_map_len(g, k0)] for g in range(bm_groups(k0))]
    nodes = [data[bm_node_offset(j, B, O):][:bm_node_len(j)] for j in range(bm_nodes(k0))]
    if not std_hmac.compare_digest(bm_root(fid, k0, maps), h["root"]):
        raise IntegrityError("UNSETTLED: the map on disk gives neither the header's root nor a commit record's")
    bm_check_nodes(maps, nodes)
    vouched = {}  # block index -> the tags block records hold for it
    for r in recs:
        if r["kind"] == REC_BLOCK and len(r["payload"]) == 16:
            vouched.setdefault(r["a"], set()).add(r["payload"])

    def leaf(n: int) -> bytes | None:
        if n >= k0:
            return None
        g = bm_group_of(n)
        return maps[g][16 * (n - bm_group_start(g)):][:16]

    def block(n: int, p: int) -> bytes | None:
        k = bm_block_count(p, B)
        last = n == k - 1
        length = (B if not last else p - n * B) + O
        lf, tags = leaf(n), vouched.get(n, set())
        if n < k0 and lf == bytes(16) and n not in vouched and not last:
            return bytes(B)
        stored = data[bm_offset(n, B, O):][:length]
        if len(stored) == length:
            plain = opens(n, last, stored)
            if plain is not None and (lf == stored[-16:] or stored[-16:] in tags or n >= k0):
                return plain
            if n >= k0 and not last and stored.count(0) == length:
                return bytes(B)
        cp = copy_with_tag(n, length, last, lambda t: t == lf or t in tags)
        return None if cp is None else opens(n, last, cp)

    for r in newest_first:
        if r["kind"] != REC_SIZE or len(r["payload"]) != 8:
            continue
        p = struct.unpack(">Q", r["payload"])[0]
        k = bm_block_count(p, B)
        if not bm_counts(p, B, O) or block(k - 1, p) is None:
            continue
        out = []
        for n in range(k):
            b = block(n, p)
            if b is None:
                raise IntegrityError(f"UNSETTLED: block {n} is no version the session's log vouches for")
            out.append(b if n < k - 1 else b[:p - n * B])
        return b"".join(out)
    raise IntegrityError("UNSETTLED: no size record of this session whose final block is vouched for")


STASH_PREFIX = "veilfs.S."  # §5.9
STASH_READ_LIMIT = 64 << 20  # a reader looks at the first 64 MiB of a stash


def stash_name(fid: bytes) -> str:
    return STASH_PREFIX + b64(fid)


def decrypt_file(vault: "Vault", data: bytes, identity: bytes) -> bytes:
    """§5.4 with holes (§5.5), empty files (§5.6), unsettled files (§5.8) and their stashes (§5.9);
    §5.10 in a vault with "block-map"."""
    stash = None  # §5.9's stash, or §5.10's session log in a vault with "block-map"
    if vault.unsettled_tails or vault.block_map:
        try:
            p = os.path.join(vault.root, os.fsencode(stash_name(identity)))
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    stash = f.read(STASH_READ_LIMIT)
        except OSError:
            pass
    if vault.block_map:
        return read_block_map_file(vault.aead, vault.keys, vault.block_size, data, identity, stash)
    return decrypt_content(vault.aead, vault.keys, vault.block_size, data, identity, vault.unsettled_tails, stash,
                           vault.ordered_growth)


def stash_block(aead, key, fid: bytes, stash: bytes, n: int, B: int, O: int, sparse: bool) -> bytes | None:
    """§5.9: block n from the record of the stash with the highest seq that gives it (None: none does)."""
    R = 16 + B + O
    cands = []
    for i in range(min(len(stash), STASH_READ_LIMIT) // R):
        rec = stash[i * R : (i + 1) * R]
        x, seq = struct.unpack(">QQ", rec[:16])
        if x >= 1 << 63:  # a hole record: blocks a … b−1 were holes
            a, b = x - (1 << 63), struct.unpack(">Q", rec[16:24])[0]
            if a <= n < b:
                cands.append((seq, None))
        elif x == n:
            cands.append((seq, rec[16:]))
    for seq, blk in sorted(cands, key=lambda c: c[0], reverse=True):
        if blk is None:
            if sparse:
                return bytes(B)
            continue
        try:
            return aead.open(key, block_aad(fid, n, False), blk)
        except IntegrityError:
            pass
    return None


def decrypt_content(aead, keys, B: int, data: bytes, identity: bytes, unsettled_tails: bool,
                    stash: bytes | None = None, ordered: bool = False) -> bytes:
    O = aead.overhead
    if len(data) == 0:
        return b""
    if ordered and len(data) >= HEADER_LEN and data[:HEADER_LEN].count(0) == HEADER_LEN:
        return b""  # §5.8 rule 4: a first write cut before its header
    flags, fid = header_decode(keys, data, unsettled_tails)
    if fid != identity:
        raise IntegrityError("header file ID differs from the entry's identity (content of another file)")
    key = file_key(keys, fid)
    sparse = bool(flags & FLAG_SPARSE)
    if flags & FLAG_UNSETTLED:
        if len(data) == HEADER_LEN:
            return b""
        end, last_plain = unsettled_end(aead, key, fid, data, B, O, sparse, ordered)
        if end is None:
            return b""
        return inner_blocks(aead, key, fid, data, B, O, sparse, end, stash) + last_plain
    p, k = plain_size(len(data), B, O)
    if k == 0:
        return b""
    out = inner_blocks(aead, key, fid, data, B, O, sparse, k - 1)
    off = HEADER_LEN + (k - 1) * (B + O)
    try:
        return out + aead.open(key, block_aad(fid, k - 1, True), data[off : off + p - (k - 1) * B + O])
    except IntegrityError as e:
        raise IntegrityError(f"block {k - 1}: {e}") from None


def inner_blocks(aead, key, fid: bytes, data: bytes, B: int, O: int, sparse: bool, count: int,
                 stash: bytes | None = None) -> bytes:
    """Blocks 0 … count−1, each a full inner block (last = 0) or, with SPARSE, a hole; in an
    unsettled file, a block that does not open is read from its stash if it has one (§5.9)."""
    out = bytearray()
    for n in range(count):
        off = HEADER_LEN + n * (B + O)
        blk = data[off : off + B + O]
        if sparse and len(blk) == B + O and blk.count(0) == len(blk):
            out += bytes(B)  # a hole: B zero bytes, unauthenticated by design
            continue
        try:
            out += aead.open(key, block_aad(fid, n, False), blk)
        except IntegrityError as e:
            got = stash_block(aead, key, fid, stash, n, B, O, sparse) if stash is not None else None
            if got is None:
                raise IntegrityError(f"block {n}: {e}") from None
            out += got
    return bytes(out)


def _opens_as_end(aead, key, fid: bytes, j: int, b: bytes, B: int, O: int, ordered: bool = False) -> bytes | None:
    """§5.8: the plaintext if slot j's bytes b open as an end of the file, else None (case (b),
    a full inner block, only without "ordered-growth")."""
    if len(b) <= O or b.count(0) == len(b):
        return None
    tries = [(b, True)] + ([(b, False)] if len(b) == B + O and not ordered else [])
    z = len(b.rstrip(b"\0"))
    tries += [(b[:n], True) for n in range(max(z, O + 1), len(b))]
    for blk, last in tries:
        try:
            return aead.open(key, block_aad(fid, j, last), blk)
        except IntegrityError:
            pass
    return None


def unsettled_end(aead, key, fid: bytes, data: bytes, B: int, O: int, sparse: bool, ordered: bool = False):
    """§5.8: (j, plaintext of block j that ends the file), or (None, b"") for an empty file."""
    S, c = B + O, len(data)
    body = c - HEADER_LEN
    F = -(-body // S) - 1
    slot = lambda j: data[HEADER_LEN + j * S : HEADER_LEN + (j + 1) * S]
    pt = _opens_as_end(aead, key, fid, F, slot(F), B, O, ordered)
    if pt is not None:
        return F, pt  # rule 1
    if body > O + 8:
        t = struct.unpack(">Q", data[-8:])[0]
        s = (c - 9 - HEADER_LEN) // S
        x = data[HEADER_LEN + s * S : c - 8]
        if t < s and len(x) > O:
            try:
                return t, aead.open(key, block_aad(fid, t, True), x)  # rule 2: a stash
            except IntegrityError:
                pass
    skipped = False
    for j in range(F - 1, -1, -1):  # rule 3: a torn final block
        b = slot(j)
        if b.count(0) == len(b):
            if sparse:
                continue
        else:
            pt = _opens_as_end(aead, key, fid, j, b, B, O, ordered)
            if pt is not None:
                return j, pt
            if ordered and len(b) == B + O:
                try:
                    aead.open(key, block_aad(fid, j, False), b)
                    continue  # a complete new inner block of a growing write torn further on
                except IntegrityError:
                    pass
        if skipped:
            raise IntegrityError(f"unsettled file: slot {j} does not open and one was skipped already")
        skipped = True
    if ordered:
        raise IntegrityError("unsettled file: no block sealed as last ends it (walked past block 0)")
    return None, b""


# ---------------------------------------------------------------- §6 names

KIND_FILE, KIND_DIR, KIND_SYMLINK = 1, 2, 3
# §6.3 and §9: with the feature "special-kinds" each special type has its own kind; without
# it every special file is 0x04 (KIND_SPECIAL, the same byte as a FIFO).
KIND_FIFO, KIND_SOCKET, KIND_CHR, KIND_BLK = 4, 5, 6, 7
KIND_SPECIAL = 4
KIND_NAMES = {1: "file", 2: "dir", 3: "symlink", 4: "fifo", 5: "socket", 6: "chardev", 7: "blockdev"}
SPECIAL_KINDS = "special-kinds"


def kind_of_mode(mode: int, special_kinds: bool = True) -> int:
    """The kind byte bound in S for a backing st_mode (§6.3)."""
    if stat.S_ISREG(mode):
        return KIND_FILE
    if stat.S_ISDIR(mode):
        return KIND_DIR
    if stat.S_ISLNK(mode):
        return KIND_SYMLINK
    if not special_kinds:
        return KIND_SPECIAL
    if stat.S_ISSOCK(mode):
        return KIND_SOCKET
    if stat.S_ISCHR(mode):
        return KIND_CHR
    if stat.S_ISBLK(mode):
        return KIND_BLK
    return KIND_FIFO


def is_special(mode: int) -> bool:
    return kind_of_mode(mode) >= KIND_FIFO


def check_device(special_kinds: bool, mode: int, identity: bytes, rdev: int):
    """§9: with "special-kinds", a device's identity starts with u64le(st_rdev)."""
    if special_kinds and (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) and identity[:8] != rdev.to_bytes(8, "little"):
        raise IntegrityError(f"device number {os.major(rdev)}:{os.minor(rdev)} is not the one its entry promises")


def valid_name(n: bytes) -> bool:
    return 1 <= len(n) <= 255 and n not in (b".", b"..") and b"/" not in n and b"\0" not in n


def name_d(keys, iv: bytes, name: bytes) -> bytes:
    return siv_encrypt(keys["names"], [iv], name)


def binding_s(keys, iv: bytes, d: bytes, kind: int, identity: bytes) -> bytes:
    return siv_encrypt(keys["binding"], [iv, d, bytes([kind])], identity)


def entry_names(d: bytes, s: bytes) -> tuple[str, str | None, str | None]:
    """§6.4: (on-disk entry name, side file name or None, side file contents or None)."""
    k = b64(d)
    if len(k) + 1 + 43 <= 255:
        return f"{k}.{b64(s)}", None, None
    h = b64(hashlib.sha256(d).digest())
    return f"veilfs.L.{h}.{b64(s)}", f"veilfs.N.{h}", k


def diriv_name(iv: bytes) -> bytes:
    """§7.1 with the feature "iv-in-name": the empty file that carries a directory's IV."""
    return b"veilfs.diriv." + b64(iv).encode()


def classify(raw: bytes):
    """§6.5: ('internal',) | ('foreign',) | ('short', K, s) | ('long', h, s)."""
    try:
        e = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ("foreign",)
    if e in (".", ".."):
        return ("internal",)
    if e.startswith("veilfs.L."):
        h, dot, s = e[len("veilfs.L.") :].partition(".")
        if dot and len(h) == 43 and len(s) == 43 and set(h) <= _B64_SET and set(s) <= _B64_SET:
            return ("long", h, s)
        return ("foreign",)
    if e.startswith("veilfs."):
        return ("internal",)
    k, dot, s = e.partition(".")
    if dot and len(k) >= 23 and len(s) == 43 and set(k) <= _B64_SET and set(s) <= _B64_SET:
        return ("short", k, s)
    return ("foreign",)


# ---------------------------------------------------------------- §3 config

TOP_FIELDS = ["format", "version", "creator", "cipher", "block_size", "features", "root_dir_iv", "slots", "mac"]
SLOT_FIELDS = ["id", "kind", "kdf", "wrapped_key"]
KDF_FIELDS = {"argon2id": ["algorithm", "memory_kib", "iterations", "parallelism", "salt"],
              "hkdf-sha256": ["algorithm", "salt"]}
FEATURES_V1 = {"header-mac", "last-block-flag", "long-names", "name-binding", "sparse-flag", "xattrs"}
OVERFLOW = "overflow"
IV_IN_NAME = "iv-in-name"
BLOCK_MAP = "block-map"
# §3.1: the config's "generation" (u64, under the MAC), present only with this feature.
VERSIONS = "versions"
OPTIONAL_FEATURES = {SPECIAL_KINDS, "deterministic", OVERFLOW, UNSETTLED_TAILS, IV_IN_NAME, ORDERED_GROWTH, BLOCK_MAP,
                     VERSIONS}


def canonical_json(obj) -> bytes:
    """§3.5 canonical JSON: compact, members in the order the dicts were built."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _no_dup_object(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ConfigError(f"duplicate key {k!r}")
        d[k] = v
    return d


def _reject_constant(c):
    raise ConfigError(f"invalid JSON constant {c}")


def _u32(v, what) -> int:
    if type(v) is not int or not 0 <= v < 2**32:
        raise ConfigError(f"{what} is not a u32")
    return v


def _str(v, what) -> str:
    if type(v) is not str:
        raise ConfigError(f"{what} is not a string")
    return v


def _exact_fields(obj, fields, what):
    if type(obj) is not dict or set(obj) != set(fields):
        raise ConfigError(f"{what} must have exactly the fields {fields}")


def parse_config(text: bytes) -> dict:
    """§3.1 and §3.3: strict parse; returns the config rebuilt in canonical member order."""
    if len(text) > 1 << 20:
        raise ConfigError("config larger than 1 MiB")
    try:
        raw = json.loads(text.decode("utf-8"), object_pairs_hook=_no_dup_object, parse_constant=_reject_constant,
                         parse_float=lambda s: _reject_constant(s))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"not valid JSON: {e}") from e
    _exact_fields(raw, TOP_FIELDS + (["generation"] if type(raw) is dict and "generation" in raw else []), "config")
    cfg = {}
    cfg["format"] = _str(raw["format"], "format")
    cfg["version"] = _u32(raw["version"], "version")
    cfg["creator"] = _str(raw["creator"], "creator")
    cfg["cipher"] = _str(raw["cipher"], "cipher")
    cfg["block_size"] = _u32(raw["block_size"], "block_size")
    if type(raw["features"]) is not list:
        raise ConfigError("features is not an array")
    cfg["features"] = [_str(f, "feature") for f in raw["features"]]
    cfg["root_dir_iv"] = _str(raw["root_dir_iv"], "root_dir_iv")
    if "generation" in raw:
        g = raw["generation"]
        if type(g) is not int or not 0 < g < 2**64:
            raise ConfigError("generation is not a u64 above 0")
        cfg["generation"] = g
    if type(raw["slots"]) is not list:
        raise ConfigError("slots is not an array")
    cfg["slots"] = []
    for i, s in enumerate(raw["slots"]):
        _exact_fields(s, SLOT_FIELDS, f"slot {i}")
        kdf = s["kdf"]
        if type(kdf) is not dict or kdf.get("algorithm") not in KDF_FIELDS:
            raise ConfigError(f"slot {i}: unknown kdf")
        _exact_fields(kdf, KDF_FIELDS[kdf["algorithm"]], f"slot {i} kdf")
        ckdf = {"algorithm": kdf["algorithm"]}
        for f in KDF_FIELDS[kdf["algorithm"]][1:]:
            ckdf[f] = _str(kdf[f], f) if f == "salt" else _u32(kdf[f], f)
        kind = _str(s["kind"], "kind")
        if kind not in ("password", "recovery"):
            raise ConfigError(f"slot {i}: unknown kind {kind!r}")
        cfg["slots"].append({"id": _u32(s["id"], "id"), "kind": kind, "kdf": ckdf,
                             "wrapped_key": _str(s["wrapped_key"], "wrapped_key")})
    cfg["mac"] = _str(raw["mac"], "mac")
    # §3.3 structural checks.
    if cfg["format"] != "veilfs" or cfg["version"] != 1:
        raise ConfigError(f"format {cfg['format']!r} version {cfg['version']} is not veilfs v1")
    feats = cfg["features"]
    # §5.10 "Upgrade": a vault being upgraded mixes v1 and v2 files; only the upgrade reads it.
    if "block-map-upgrade" in feats:
        raise ConfigError("an upgrade to block maps has not finished: run veilfs upgrade to finish it")
    if len(set(feats)) != len(feats) or not FEATURES_V1 <= set(feats) <= FEATURES_V1 | OPTIONAL_FEATURES:
        raise ConfigError(f"feature set {feats} is not a v1 set")
    if ORDERED_GROWTH in feats and UNSETTLED_TAILS not in feats:
        raise ConfigError(f"feature {ORDERED_GROWTH} without {UNSETTLED_TAILS}")
    if "generation" in cfg and VERSIONS not in feats:
        raise ConfigError(f"a generation without feature {VERSIONS}")
    if BLOCK_MAP in feats and "deterministic" in feats:
        raise ConfigError(f"feature {BLOCK_MAP} in a deterministic vault")
    # §17: "deterministic" goes with AES-256-GCM-SIV, and only with it.
    if ("deterministic" in feats) != (cfg["cipher"] == "AES-256-GCM-SIV"):
        raise ConfigError("cipher AES-256-GCM-SIV and feature deterministic must go together")
    B = cfg["block_size"]
    if not (512 <= B <= 1 << 20) or B & (B - 1):
        raise ConfigError(f"invalid block size {B}")
    ContentAead(cfg["cipher"])
    try:
        if len(unb64(cfg["root_dir_iv"])) != 16:
            raise ValueError
    except ValueError:
        raise ConfigError("root_dir_iv is not 16 bytes of base64url") from None
    if not cfg["slots"]:
        raise ConfigError("no key slots")
    return cfg


def slot_aad(slot: dict) -> bytes:
    return b"veilfs v1 key slot\0" + canonical_json(["veilfs", 1, slot["id"], slot["kind"], slot["kdf"]])


def config_mac(cfg: dict, master: bytes) -> str:
    canon = dict(cfg)
    canon["mac"] = ""
    return b64(hmac256(subkeys(master)["config_mac"], b"veilfs v1 config\0" + canonical_json(canon)))


def kek_for(slot: dict, secret: bytes) -> bytes | None:
    kdf = slot["kdf"]
    salt = unb64(kdf["salt"])
    if len(salt) < 16:
        raise ValueError("salt shorter than 16 bytes")
    if kdf["algorithm"] == "argon2id":
        m, t, p = kdf["memory_kib"], kdf["iterations"], kdf["parallelism"]
        if not (1 <= p <= 64 and 1 <= t <= 100 and 8 * p <= m <= 4 * 1024 * 1024):
            return None
        return Argon2id(salt=salt, length=32, iterations=t, lanes=p, memory_cost=m).derive(secret)
    return hkdf(salt, secret, b"veilfs v1 recovery slot", 32)


def unwrap(kek: bytes, wrapped: bytes, aad: bytes) -> bytes | None:
    if len(wrapped) != 60:
        return None
    try:
        return AESGCM(kek).decrypt(wrapped[:12], wrapped[12:], aad)
    except InvalidTag:
        return None


def unlock(cfg: dict, secret: bytes, kind: str) -> tuple[bytes, int]:
    """§3.4. Returns (master key, slot id). `secret` is the password bytes or the 32-byte recovery key."""
    tried = 0
    for slot in cfg["slots"]:
        if slot["kind"] != kind:
            continue
        tried += 1
        try:
            kek = kek_for(slot, secret)
            wrapped = unb64(slot["wrapped_key"])
        except ValueError:
            continue  # this reader skips a slot with a bad salt (FORMAT.md Q5)
        if kek is None:
            continue
        master = unwrap(kek, wrapped, slot_aad(slot))
        if master is not None:
            if not std_hmac.compare_digest(config_mac(cfg, master).encode(), cfg["mac"].encode()):
                raise ConfigError("config MAC does not verify: a field was edited")
            return master, slot["id"]
    if tried == 0:
        raise ConfigError(f"no {kind} slot")
    raise WrongSecret("no slot accepted the secret")


# ---------------------------------------------------------------- §3.6 recovery key

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _rk_checksum(key: bytes) -> int:
    h = hashlib.sha256(b"veilfs recovery key" + key).digest()
    return (h[0] << 12) | (h[1] << 4) | (h[2] >> 4)


def recovery_display(key: bytes) -> str:
    n = int.from_bytes(key, "big") << 4  # 256 bits + 4 zero padding bits = 52 characters
    chars = [CROCKFORD[(n >> (5 * i)) & 31] for i in range(51, -1, -1)]
    c = _rk_checksum(key)
    chars += [CROCKFORD[(c >> (5 * i)) & 31] for i in range(3, -1, -1)]
    s = "".join(chars)
    return "-".join(s[i : i + 4] for i in range(0, 56, 4))


def recovery_parse(text: str) -> bytes:
    vals = []
    for ch in text:
        if ch == "-" or ch.isspace():
            continue
        up = {"O": "0", "I": "1", "L": "1"}.get(ch.upper(), ch.upper())
        if up not in CROCKFORD:
            raise ValueError(f"recovery key contains {ch!r}")
        vals.append(CROCKFORD.index(up))
    if len(vals) != 56:
        raise ValueError(f"recovery key has {len(vals)} characters, not 56")
    n = 0
    for v in vals[:52]:
        n = (n << 5) | v
    key = (n >> 4).to_bytes(32, "big")  # padding bits ignored, as the implementation does
    check = 0
    for v in vals[52:]:
        check = (check << 5) | v
    if check != _rk_checksum(key):
        raise ValueError("recovery key checksum mismatch (typo)")
    return key


# ---------------------------------------------------------------- the vault

def read_target_file(cdir: bytes, identity: bytes) -> bytes:
    """§8.1: the side file veilfs.T.<b64(ID)>, a regular file of at most 4151 bytes."""
    side = os.path.join(cdir, b"veilfs.T." + b64(identity).encode())
    try:
        st = os.lstat(side)
    except FileNotFoundError:
        raise IntegrityError("symlink target file is missing") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > 16 + 24 + 4095 + 16:
        raise IntegrityError("symlink target file is not a regular file of at most 4151 bytes")
    with open(side, "rb") as f:
        return f.read()


XATTR_MORE_PREFIX = "user.veilfs.+"


def xattr_more_name(first_part: bytes) -> str:
    """§16.1: the continuation's name follows the first part's bytes."""
    return XATTR_MORE_PREFIX + b64(hashlib.sha256(first_part).digest())


def xattr_name_decrypt(keys, identity: bytes, stored: str) -> bytes:
    """§16: the plaintext name of a stored name user.veilfs.<b64(SIV)>."""
    try:
        ct = unb64(stored[len("user.veilfs."):])
    except ValueError:
        raise IntegrityError("xattr name is not base64url") from None
    return siv_decrypt(keys["xattr_names"], [identity], ct)


def xattr_value_key(keys, identity: bytes) -> bytes:
    return hkdf(identity, keys["content"], b"xattr-value", 32)


def xattr_value_open(keys, aead: "ContentAead", identity: bytes, stored: str, w: bytes) -> bytes:
    """§16: W = nonce ‖ AEAD(value key, nonce, V, AAD = "veilfs v1 xattr" ‖ stored name) ‖ tag."""
    if len(w) < aead.overhead:
        raise IntegrityError("xattr value is truncated")
    try:
        return aead._seal_or_open(xattr_value_key(keys, identity), w[: aead.nonce_len], b"veilfs v1 xattr" + stored.encode(),
                                  w[aead.nonce_len:], False)
    except InvalidTag:
        raise IntegrityError("xattr value failed authentication") from None


class Vault:
    def __init__(self, root: str, master: bytes, cfg: dict):
        self.root = os.fsencode(root)
        self.cfg = cfg
        self.keys = subkeys(master)
        self.aead = ContentAead(cfg["cipher"])
        self.block_size = cfg["block_size"]
        self.root_iv = unb64(cfg["root_dir_iv"])
        self.special_kinds = SPECIAL_KINDS in cfg["features"]
        self.overflow = OVERFLOW in cfg["features"]
        self.unsettled_tails = UNSETTLED_TAILS in cfg["features"]
        self.iv_in_name = IV_IN_NAME in cfg["features"]
        self.ordered_growth = ORDERED_GROWTH in cfg["features"]
        self.block_map = BLOCK_MAP in cfg["features"]
        self.errors: list[tuple[bytes, str]] = []

    @classmethod
    def open(cls, root: str, password: bytes | None = None, recovery_key: bytes | None = None) -> "Vault":
        with open(os.path.join(root, "veilfs.conf"), "rb") as f:
            cfg = parse_config(f.read())
        if recovery_key is not None:
            master, _ = unlock(cfg, recovery_key, "recovery")
        else:
            master, _ = unlock(cfg, password, "password")
        return cls(root, master, cfg)

    def _err(self, path: bytes, msg: str):
        self.errors.append((path, msg))

    def check_diriv(self, cdir: bytes, iv: bytes):
        """§7.1: the copy must equal the authoritative IV, or be missing (the old form: or empty)."""
        if self.iv_in_name:
            try:
                st = os.lstat(os.path.join(cdir, diriv_name(iv)))
            except FileNotFoundError:
                if any(n.startswith(b"veilfs.diriv.") for n in os.listdir(cdir)):
                    raise IntegrityError("an IV name other than the one the directory's entry promises") from None
                return
            if not stat.S_ISREG(st.st_mode) or st.st_size != 0:
                raise IntegrityError("the IV name is not an empty regular file")
            return
        p = os.path.join(cdir, b"veilfs.diriv")
        try:
            with open(p, "rb") as f:
                got = f.read(17)
        except FileNotFoundError:
            return
        if got and got != iv:
            raise IntegrityError("veilfs.diriv does not match the IV the directory's entry promises")

    def read_symlink(self, path: bytes, identity: bytes) -> bytes:
        """§8, and §8.1 (the long form: the blob in a side file named by the ID)."""
        try:
            blob = unb64(os.readlink(path).decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            raise IntegrityError("symlink target is not base64url") from None
        if self.overflow and len(blob) == 16:
            if blob != identity:
                raise IntegrityError("symlink target does not belong to this entry")
            blob = read_target_file(os.path.dirname(path), identity)
        if len(blob) <= 16 + self.aead.overhead or blob[:16] != identity:
            raise IntegrityError("symlink target does not belong to this entry")
        return self.aead.open(file_key(self.keys, identity), block_aad(identity, 0, True), blob[16:])

    def read_xattrs(self, path: bytes, identity: bytes) -> dict[bytes, bytes]:
        """§16 and §16.1: the object's user. attributes, continuations joined."""
        out = {}
        names = os.listxattr(path, follow_symlinks=False)
        for n in names:
            if not n.startswith("user.veilfs.") or n.startswith(XATTR_MORE_PREFIX):
                continue
            plain = xattr_name_decrypt(self.keys, identity, n)
            raw = os.getxattr(path, n, follow_symlinks=False)
            more = xattr_more_name(raw)
            if self.overflow and len(raw) == 65536 and more in names:
                raw += os.getxattr(path, more, follow_symlinks=False)
            out[plain] = xattr_value_open(self.keys, self.aead, identity, n, raw)
        return out

    def list_dir(self, cdir: bytes, iv: bytes):
        """§6.5, §6.6 and §10: decoded entries of one directory, duplicates resolved."""
        chosen: dict[bytes, dict] = {}
        for raw in sorted(os.listdir(cdir)):
            cls_ = classify(raw)
            cpath = os.path.join(cdir, raw)
            if cls_[0] == "internal":
                continue
            if cls_[0] == "foreign":
                self._err(cpath, "not a veilfs entry name")
                continue
            try:
                if cls_[0] == "short":
                    d, s64 = unb64(cls_[1]), cls_[2]
                else:
                    h, s64 = cls_[1], cls_[2]
                    with open(os.path.join(cdir, b"veilfs.N." + h.encode()), "rb") as f:
                        side = f.read(4097)
                    if len(side) > 4096:
                        raise IntegrityError("long-name side file is too large")
                    d = unb64(side.decode("ascii").rstrip())
                    if b64(hashlib.sha256(d).digest()) != h:
                        raise IntegrityError("long-name side file does not match its hash")
                    if len(b64(d)) <= 211:
                        raise IntegrityError("long-name form used for a short name (non-canonical, FORMAT.md Q4)")
                name = siv_decrypt(self.keys["names"], [iv], d)
                if not valid_name(name):
                    raise IntegrityError("name decrypts to an invalid name")
                st = os.lstat(cpath)
                kind = kind_of_mode(st.st_mode, self.special_kinds)
                identity = siv_decrypt(self.keys["binding"], [iv, d, bytes([kind])], unb64(s64))
                if len(identity) != 16:
                    raise IntegrityError("identity is not 16 bytes")
                check_device(self.special_kinds, st.st_mode, identity, st.st_rdev)
            except (IntegrityError, ValueError, UnicodeDecodeError, FileNotFoundError) as e:
                self._err(cpath, f"entry does not decode: {e}")
                continue
            ent = {"name": name, "cpath": cpath, "kind": kind, "identity": identity, "stat": st, "d": d}
            prev = chosen.get(d)
            if prev is None or (st.st_ctime_ns > prev["stat"].st_ctime_ns):
                if prev is not None:
                    self._err(prev["cpath"], "duplicate entry hidden by a newer one")
                chosen[d] = ent
            else:
                self._err(cpath, "duplicate entry hidden by a newer one")
        return list(chosen.values())

    def walk(self):
        """Yields (plaintext relative path, entry, decrypted object or None) for the whole tree (§12)."""
        try:
            self.check_diriv(self.root, self.root_iv)
        except IntegrityError as e:
            self._err(self.root, str(e))
            return
        stack = [(self.root, self.root_iv, b"")]
        while stack:
            cdir, iv, rel = stack.pop()
            for ent in self.list_dir(cdir, iv):
                prel = os.path.join(rel, ent["name"]) if rel else ent["name"]
                try:
                    if ent["kind"] == KIND_DIR:
                        self.check_diriv(ent["cpath"], ent["identity"])
                        stack.append((ent["cpath"], ent["identity"], prel))
                        yield prel, ent, None
                    elif ent["kind"] == KIND_FILE:
                        with open(ent["cpath"], "rb") as f:
                            yield prel, ent, decrypt_file(self, f.read(), ent["identity"])
                    elif ent["kind"] == KIND_SYMLINK:
                        yield prel, ent, self.read_symlink(ent["cpath"], ent["identity"])
                    else:
                        yield prel, ent, None
                except IntegrityError as e:
                    self._err(ent["cpath"], str(e))


# ---------------------------------------------------------------- checks

class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok: bool, what: str, detail: str = ""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL {what}{': ' + detail if detail else ''}")


def hx(s: str) -> bytes:
    return bytes.fromhex(s)


def run_vectors(path: str, t: Tally):
    with open(path) as f:
        v = json.load(f)
    # HChaCha20 against draft-irtf-cfrg-xchacha-03 §2.2.1 (independent of veilfs).
    t.check(hchacha20(bytes(range(32)), hx("000000090000004a0000000031415927")).hex()
            == "82413b4227b27bfed30e42508a877d73a0f9e4d58a74a853c12ec41326d3ecdc", "HChaCha20 draft test vector")
    master = hx(v["master_key"])
    keys = subkeys(master)
    for name, val in v["subkeys"].items():
        t.check(keys[name].hex() == val, f"subkey {name}")
    for c in v["content"]:
        what = f"content {c['cipher']} block {c['block']}"
        fid = hx(c["file_id"])
        t.check(file_key(keys, fid).hex() == c["file_key"], f"{what}: file key")
        aead = ContentAead(c["cipher"])
        aad = block_aad(fid, c["block"], c["last"])
        sealed = aead.seal(hx(c["file_key"]), hx(c["nonce"]), aad, hx(c["plaintext"]))
        t.check(sealed.hex() == c["on_disk"], f"{what}: seal")
        t.check(aead.open(hx(c["file_key"]), aad, hx(c["on_disk"])).hex() == c["plaintext"], f"{what}: open")
        try:
            aead.open(hx(c["file_key"]), block_aad(fid, c["block"], not c["last"]), hx(c["on_disk"]))
            t.check(False, f"{what}: flipped last flag must fail")
        except IntegrityError:
            t.check(True, "")
    for h in v["headers"]:
        enc = header_encode(keys, h["flags"], hx(h["file_id"]))
        t.check(enc.hex() == h["bytes"], f"header flags {h['flags']}: encode")
        t.check(header_decode(keys, hx(h["bytes"])) == (h["flags"], hx(h["file_id"])), f"header flags {h['flags']}: decode")
    un = v.get("unsettled", {})
    for h in un.get("headers", []):
        what = f"unsettled header flags {h['flags']}"
        t.check(header_encode(keys, h["flags"], hx(h["file_id"])).hex() == h["bytes"], f"{what}: encode")
        t.check(header_decode(keys, hx(h["bytes"]), True) == (h["flags"], hx(h["file_id"])), f"{what}: decode")
        try:
            header_decode(keys, hx(h["bytes"]), False)
            t.check(False, f"{what}: must be refused without {UNSETTLED_TAILS}")
        except IntegrityError:
            t.check(True, "")
    for f in un.get("files", []):
        what = f"unsettled file ({f['rule']})"
        got = decrypt_content(ContentAead(f["cipher"]), keys, f["block_size"], hx(f["ciphertext"]), hx(f["file_id"]), True)
        t.check(got.hex() == f["plaintext"], what, f"{len(got)} bytes")
    for f in v.get("ordered_growth", {}).get("files", []):
        what = f"ordered-growth file ({f['rule']})"
        try:
            got = decrypt_content(ContentAead(f["cipher"]), keys, f["block_size"], hx(f["ciphertext"]),
                                  hx(f["file_id"]), True, None, True)
            t.check(f["plaintext"] is not None and got.hex() == f["plaintext"], what, f"{len(got)} bytes")
        except IntegrityError as e:
            t.check(f["plaintext"] is None, what, str(e))
    for f in v.get("inner_stash", {}).get("files", []):
        what = f"inner stash ({f['rule']})"
        aead, ct, fid = ContentAead(f["cipher"]), hx(f["ciphertext"]), hx(f["file_id"])
        t.check(stash_name(fid) == f["stash_name"], f"{what}: stash name")
        try:
            decrypt_content(aead, keys, f["block_size"], ct, fid, True)
            t.check(False, f"{what}: must fail without the stash")
        except IntegrityError:
            t.check(True, "")
        got = decrypt_content(aead, keys, f["block_size"], ct, fid, True, hx(f["stash"]))
        t.check(got.hex() == f["plaintext"], what, f"{len(got)} bytes")
    for n in v["names"]:
        what = f"name {n['name'][:20]!r}"
        iv, ident = hx(n["dir_iv"]), hx(n["identity"])
        d = name_d(keys, iv, n["name"].encode())
        t.check(d.hex() == n["d"], f"{what}: D")
        s = binding_s(keys, iv, d, n["kind"], ident)
        t.check(s.hex() == n["s"], f"{what}: S")
        entry, side, contents = entry_names(d, s)
        t.check(entry == n["entry"], f"{what}: entry name", entry)
        t.check(side == n["side_file"] and contents == n["side_file_contents"], f"{what}: side file")
        t.check(siv_decrypt(keys["names"], [iv], hx(n["d"])) == n["name"].encode(), f"{what}: decrypt D")
        t.check(siv_decrypt(keys["binding"], [iv, hx(n["d"]), bytes([n["kind"]])], hx(n["s"])) == ident,
                f"{what}: open S")
        kinds = set(KIND_NAMES) - {n["kind"]}
        for k in kinds:
            try:
                siv_decrypt(keys["binding"], [iv, hx(n["d"]), bytes([k])], hx(n["s"]))
                t.check(False, f"{what}: S must not open as kind {k}")
            except IntegrityError:
                t.check(True, "")
        cls_ = classify(entry.encode())
        t.check(cls_[0] == ("long" if side else "short"), f"{what}: classified as {cls_[0]}")
    modes = {"Fifo": stat.S_IFIFO, "Socket": stat.S_IFSOCK, "CharDevice": stat.S_IFCHR, "BlockDevice": stat.S_IFBLK}
    for n in v["special_bindings"]:
        sk = SPECIAL_KINDS in n["features"]
        what = f"special {n['type']} ({'with' if sk else 'without'} {SPECIAL_KINDS})"
        iv, ident, mode = hx(n["dir_iv"]), hx(n["identity"]), modes[n["type"]]
        kind = kind_of_mode(mode, sk)
        t.check(kind == n["kind"], f"{what}: kind byte", f"{kind} vs {n['kind']}")
        d = name_d(keys, iv, n["name"].encode())
        s = binding_s(keys, iv, d, kind, ident)
        t.check(d.hex() == n["d"] and s.hex() == n["s"], f"{what}: D and S")
        t.check(entry_names(d, s)[0] == n["entry"], f"{what}: entry name")
        try:
            check_device(sk, mode, ident, n["rdev"])
            t.check(True, "")
        except IntegrityError as e:
            t.check(False, f"{what}: device number", str(e))
        if sk and n["type"] in ("CharDevice", "BlockDevice"):
            try:
                check_device(sk, mode, ident, n["rdev"] + 1)
                t.check(False, f"{what}: another device number must fail")
            except IntegrityError:
                t.check(True, "")
        # With the feature, S opens only as its own special type; without, as every one.
        for other, omode in modes.items():
            try:
                siv_decrypt(keys["binding"], [iv, d, bytes([kind_of_mode(omode, sk)])], s)
                t.check(not sk or omode == mode, f"{what}: S must not open as {other}")
            except IntegrityError:
                t.check(sk and omode != mode, f"{what}: S must open as {other} without the feature")
    # §17: deterministic vaults. Identities, derived nonces, GCM-SIV blocks, a symlink blob.
    det = v["deterministic"]
    ids_key = hkdf(b"veilfs v1", master, b"deterministic-ids", 32)
    t.check(ids_key.hex() == det["ids_key"], "deterministic: identity key")
    for i in det["identities"]:
        ident = hmac256(ids_key, b"veilfs v1 reverse id\0" + bytes([i["kind"]]) + hx(i["parent_iv"]) + i["name"].encode())[:16]
        t.check(ident.hex() == i["identity"], f"deterministic: identity of {i['name']!r}")
    for c in det["content"]:
        what = f"deterministic block {c['block']}"
        nonce = struct.pack(">Q", c["block"]) + bytes([1 if c["last"] else 0]) + b"\0\0\0"
        t.check(nonce.hex() == c["nonce"], f"{what}: derived nonce")
        aead = ContentAead(c["cipher"])
        aad = block_aad(hx(c["file_id"]), c["block"], c["last"])
        t.check(file_key(keys, hx(c["file_id"])).hex() == c["file_key"], f"{what}: file key")
        t.check(aead.seal(hx(c["file_key"]), nonce, aad, hx(c["plaintext"])).hex() == c["on_disk"], f"{what}: seal")
        t.check(aead.open(hx(c["file_key"]), aad, hx(c["on_disk"])).hex() == c["plaintext"], f"{what}: open")
    sl = det["symlink"]
    sid = hx(sl["identity"])
    blob = sid + ContentAead("AES-256-GCM-SIV").seal(file_key(keys, sid), struct.pack(">Q", 0) + b"\1\0\0\0",
                                                      block_aad(sid, 0, True), sl["target"].encode())
    t.check(b64(blob) == sl["stored"], "deterministic: symlink blob")
    # §8.1 and §16.1: feature "overflow".
    ov = v["overflow"]
    aead = ContentAead(ov["cipher"])
    sl = ov["symlink"]
    sid, nonce = hx(sl["identity"]), hx(sl["nonce"])
    blob = sid + aead.seal(file_key(keys, sid), nonce, block_aad(sid, 0, True), sl["target"].encode())
    t.check(blob.hex() == sl["side_file_contents"], "overflow: symlink side file contents")
    t.check(len(b64(blob)) == sl["inline_length"] and len(b64(blob)) > 4095, "overflow: inline form too long")
    t.check(b64(sid) == sl["backing_target"], "overflow: backing target is b64(ID)")
    t.check(("veilfs.T." + b64(sid)) == sl["side_file"], "overflow: side file name")
    t.check(aead.open(file_key(keys, sid), block_aad(sid, 0, True), blob[16:]) == sl["target"].encode(),
            "overflow: side file opens")
    x = ov["xattr"]
    xid = hx(x["identity"])
    stored = "user.veilfs." + b64(siv_encrypt(keys["xattr_names"], [xid], x["name"].encode()))
    t.check(stored == x["stored_name"], "overflow: xattr stored name")
    value = bytes(i % 251 for i in range(65536))
    t.check(hashlib.sha256(value).hexdigest() == x["value_sha256"], "overflow: xattr value")
    w = hx(x["nonce"]) + aead._seal_or_open(xattr_value_key(keys, xid), hx(x["nonce"]),
                                            b"veilfs v1 xattr" + stored.encode(), value, True)
    head, tail = w[:65536], w[65536:]
    t.check(len(head) == x["first_part_length"] and hashlib.sha256(head).hexdigest() == x["first_part_sha256"],
            "overflow: xattr first part")
    t.check(xattr_more_name(head) == x["continuation_name"], "overflow: continuation name")
    t.check(tail.hex() == x["continuation"], "overflow: continuation bytes")
    t.check(xattr_value_open(keys, aead, xid, stored, head + hx(x["continuation"])) == value,
            "overflow: value opens from both parts")
    try:
        xattr_value_open(keys, aead, xid, stored, head)
        t.check(False, "overflow: the first part alone must not open")
    except IntegrityError:
        t.check(True, "")
    # §7.1: feature "iv-in-name".
    for n in v["iv_in_name"]:
        t.check(diriv_name(hx(n["dir_iv"])).decode() == n["name"], f"iv-in-name: name of {n['dir_iv']}")
        t.check(unb64(n["name"][len("veilfs.diriv."):]) == hx(n["dir_iv"]), "iv-in-name: the name decodes to the IV")
    rk = v["recovery_key"]
    t.check(recovery_display(hx(rk["bytes"])) == rk["display"], "recovery key display")
    t.check(recovery_parse(rk["display"]) == hx(rk["bytes"]), "recovery key parse")
    t.check(recovery_parse(rk["display"].lower().replace("-", " ").replace("0", "o")) == hx(rk["bytes"]),
            "recovery key parse (lowercase, spaces, O for 0)")
    for key, sk in [("config", False), ("config_special_kinds", True), ("config_iv_in_name", True)]:
        conf = v[key]
        cfg = parse_config(conf["file"].encode())
        t.check((SPECIAL_KINDS in cfg["features"]) == sk, f"{key}: feature {SPECIAL_KINDS}")
        t.check((IV_IN_NAME in cfg["features"]) == (key == "config_iv_in_name"), f"{key}: feature {IV_IN_NAME}")
        mk, slot = unlock(cfg, conf["password"].encode(), "password")
        t.check(mk.hex() == conf["master_key"], f"{key} unlock: master key")
        t.check(config_mac(cfg, mk) == cfg["mac"], f"{key} MAC")
    conf = v["config"]
    cfg = parse_config(conf["file"].encode())
    try:
        unlock(cfg, b"wrong password", "password")
        t.check(False, "config: wrong password must fail")
    except WrongSecret:
        t.check(True, "")
    edited = parse_config(conf["file"].replace('"veilfs 0.1.0"', '"veilfs 0.1.1"').encode())
    try:
        unlock(edited, conf["password"].encode(), "password")
        t.check(False, "config: edited creator must fail the MAC")
    except ConfigError:
        t.check(True, "")
    # §5.10: the block map (layout, root, header v2, a settled file).
    bm = v.get("block_map")
    if bm is not None:
        B, O = bm["block_size"], bm["overhead"]
        for b in bm["blocks"]:
            t.check(bm_group_of(b["block"]) == b["group"] and bm_offset(b["block"], B, O) == b["offset"],
                    f"block map: block {b['block']} offset", str(bm_offset(b["block"], B, O)))
        for g in bm["groups"]:
            gi = g["group"]
            t.check((bm_group_start(gi), bm_capacity(gi), bm_map_offset(gi, B, O))
                    == (g["first_block"], g["capacity"], g["offset"]), f"block map: group {gi}")
        for nd in bm["nodes"]:
            t.check((bm_node_offset(nd["node"], B, O), bm_node_len(nd["node"])) == (nd["offset"], nd["length"]),
                    f"block map: node {nd['node']}")
        for sz in bm["sizes"]:
            p, c = sz["plaintext"], sz["ciphertext"]
            t.check(bm_cipher_size(p, B, O) == c and bm_plain_size(c, B, O)[0] == p, f"block map: size of {p} bytes")
        for c in bm["invalid_sizes"]:
            try:
                bm_plain_size(c, B, O)
                t.check(False, f"block map: {c} bytes must be invalid")
            except IntegrityError:
                t.check(True, "")
        # The regions tile the file: around group and span edges, what precedes block n ends where it starts.
        for n in [0, 1, 2, 3, 4, 7, 8, 255, 256, 257, 511, 512, MAP_SPAN - 1, MAP_SPAN, MAP_SPAN + 1, 2 * MAP_SPAN]:
            g = bm_group_of(n)
            if bm_group_start(g) != n:
                ok = bm_offset(n - 1, B, O) + B + O == bm_offset(n, B, O)
            else:
                ok = bm_map_offset(g, B, O) + 16 * bm_capacity(g) == bm_offset(n, B, O)
                before = bm_map_offset(g, B, O)
                if n and n % MAP_SPAN == 0:
                    j = n // MAP_SPAN - 1
                    ok = ok and bm_node_offset(j, B, O) + bm_node_len(j) == before
                    before = bm_node_offset(j, B, O)
                ok = ok and (bm_offset(n - 1, B, O) + B + O == before if n else before == H2)
            t.check(ok, f"block map: regions tile the file at block {n}")
        for r in bm["roots"]:
            k, fid = r["blocks"], hx(r["file_id"])
            leaves = [bytes(16) if n >= 2 and n % 5 == 2 else hashlib.sha256(b"leaf" + struct.pack(">Q", n)).digest()[:16]
                      for n in range(k)]
            t.check((bm_groups(k), bm_nodes(k)) == (r["groups"], r["nodes"]), f"block map: {k} blocks: groups, nodes")
            t.check(bm_root(fid, k, bm_map_blocks(leaves)).hex() == r["root"], f"block map: root of {k} blocks")
        for h in bm["headers"]:
            what = f"header v2 flags {h['flags']} blocks {h['blocks']}"
            enc = header_v2_encode(keys, h["flags"], hx(h["file_id"]), h["generation"], hx(h["writer"]), h["blocks"],
                                   hx(h["root"]))
            t.check(enc.hex() == h["bytes"], f"{what}: encode")
            try:
                d = header_v2_decode(keys, hx(h["bytes"]))
            except IntegrityError as e:
                t.check(False, f"{what}: decode", str(e))
                continue
            t.check((d["flags"], d["file_id"].hex(), d["generation"], d["writer"].hex(), d["blocks"], d["root"].hex())
                    == (h["flags"], h["file_id"], h["generation"], h["writer"], h["blocks"], h["root"]), f"{what}: decode")
            bad = bytearray(hx(h["bytes"]))
            bad[43] ^= 1  # the block count
            try:
                header_v2_decode(keys, bytes(bad))
                t.check(False, f"{what}: an edited block count must fail")
            except IntegrityError:
                t.check(True, "")
            try:
                header_decode(keys, hx(h["bytes"]), True)
                t.check(False, f"{what}: must not verify as a v1 header")
            except IntegrityError:
                t.check(True, "")
        for f in bm["files"]:
            aead, ct, fid = ContentAead(f["cipher"]), hx(f["ciphertext"]), hx(f["file_id"])
            try:
                t.check(read_block_map_file(aead, keys, B, ct, fid).hex() == f["plaintext"], "block map: settled file")
            except IntegrityError as e:
                t.check(False, "block map: settled file", str(e))
            t.check(ct[:H2].hex() == f["header"] and header_v2_decode(keys, ct)["root"].hex() == f["root"],
                    "block map: settled file header")
            # An older version of block 1 (another ciphertext that opens as block 1) is refused.
            k_ = file_key(keys, fid)
            older = aead.seal(k_, bytes(12), block_aad(fid, 1, False), b"o" * B)
            at = bm_offset(1, B, O)
            rolled = ct[:at] + older + ct[at + B + O:]
            try:
                read_block_map_file(aead, keys, B, rolled, fid)
                t.check(False, "block map: an older block 1 must fail")
            except IntegrityError:
                t.check(True, "")
    # §5.10 "Write sessions and their log": records of each kind, and files of a session read by their log.
    sess = v.get("block_map_sessions")
    if sess is not None:
        for r in sess["records"]:
            what = f"session record {r['what']}"
            fid, g, raw = hx(r["file_id"]), r["generation"], hx(r["bytes"])
            enc = log_record(keys, fid, g, r["kind"], r["seq"], r["a"], hx(r["payload"]))
            t.check(enc.hex() == r["bytes"], f"{what}: encode")
            got = parse_log(keys, fid, g, raw)
            t.check([(x["kind"], x["seq"], x["a"], x["payload"].hex()) for x in got]
                    == [(r["kind"], r["seq"], r["a"], r["payload"])], f"{what}: parse")
            # Bound to its file and session; every byte of it authenticated.
            t.check(parse_log(keys, fid, g + 1, raw) == [] and parse_log(keys, bytes(16), g, raw) == [],
                    f"{what}: not a record of another session or file")
            for at in [8, 16, 24, len(raw) - 1]:
                bad = bytearray(raw)
                bad[at] ^= 1
                t.check(parse_log(keys, fid, g, bytes(bad)) == [], f"{what}: byte {at} changed must not verify")
        for f in sess["files"]:
            aead, ct, fid = ContentAead(f["cipher"]), hx(f["ciphertext"]), hx(f["file_id"])
            what = f"block map session: {f['rule']}"
            t.check(f["log_name"] == stash_name(fid), f"{what}: log name")
            try:
                got = read_block_map_file(aead, keys, f["block_size"], ct, fid, hx(f["log"]) or None)
                t.check(f["plaintext"] is not None and got.hex() == f["plaintext"], what,
                        "read although the rules make it an integrity error" if f["plaintext"] is None else "")
            except IntegrityError as e:
                t.check(f["plaintext"] is None, what, str(e))
    # §19 tombstone logs: the entry's token, the log's header and records, each byte authenticated.
    ts = v.get("tombstones")
    if ts is not None:
        iv, client = hx(ts["dir_iv"]), hx(ts["client"])

        def lp(*parts: bytes) -> bytes:
            return b"".join(len(x).to_bytes(4, "big") + x for x in parts)

        token = hmac256(keys["record_mac"], lp(b"veilfs v1 tombstone name", iv, ts["on_disk"].encode()))[:16]
        t.check(token.hex() == ts["token"], "tombstone: token")
        t.check(ts["log_name"] == "veilfs.D." + b64(client), "tombstone: log name")

        def parse_tombs(raw: bytes, iv: bytes) -> list[tuple[str, int, int, int]] | None:
            if raw[:4] != b"VFTL" or raw[4] != 1:
                return None
            cl, out = raw[8:24], []
            for at in range(24, len(raw) - 41, 42):
                r = raw[at:at + 42]
                mac = hmac256(keys["record_mac"], lp(b"veilfs v1 tombstone", iv, cl, r[:26]))[:16]
                if not std_hmac.compare_digest(mac, r[26:]) or r[16] not in (1, 2):
                    return out
                out.append((r[:16].hex(), r[16], r[17], int.from_bytes(r[18:26], "big")))
            return out

        raw = hx(ts["log"])
        want = [(r["token"], r["op"], r["kind"], r["time"]) for r in ts["records"]]
        t.check(parse_tombs(raw, iv) == want, "tombstone: log records")
        t.check(parse_tombs(raw, bytes(16)) == [], "tombstone: a log moved to another directory vouches for nothing")
        for at in range(24, len(raw)):
            bad = bytearray(raw)
            bad[at] ^= 1
            got = parse_tombs(bytes(bad), iv)
            t.check(got is not None and len(got) == (at - 24) // 42, f"tombstone: byte {at} changed must not verify")
    # Layout edge cases of §5.3.
    for p in [0, 1, 4095, 4096, 4097, 20000, 3 * 4096, 10**6 + 7]:
        for B, O in [(4096, 28), (512, 40), (1 << 20, 28)]:
            c = cipher_size(p, B, O)
            t.check(plain_size(c, B, O)[0] == p, f"layout p={p} B={B} O={O}")
    t.check(plain_size(36, 4096, 28) == (0, 0), "layout: a header alone is an empty file")
    for c in [1, 35, 36 + 28, 36 + 4124 + 10]:
        try:
            plain_size(c, 4096, 28)
            t.check(False, f"layout: {c} bytes must be invalid")
        except IntegrityError:
            t.check(True, "")
    # Strict base64url (§1).
    for bad in ["YQ=", "YR", "Y", "a+b/"]:
        try:
            unb64(bad)
            t.check(False, f"unb64({bad!r}) must fail")
        except ValueError:
            t.check(True, "")


# ---------------------------------------------------------------- compare with a source tree

def walk_source(src: bytes):
    out = {}
    for dirpath, dirnames, filenames in os.walk(src):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, src)] = p
    return out


def compare(vault: Vault, src: str, t: Tally, verbose: bool):
    srcb = os.fsencode(src)
    expected = walk_source(srcb)
    got = {}
    for prel, ent, obj in vault.walk():
        got[prel] = (ent, obj)
    for path, msg in vault.errors:
        t.check(False, "vault error", f"{path!r}: {msg}")
    for rel in sorted(set(expected) | set(got)):
        what = repr(rel)[2:-1]
        if rel not in got:
            t.check(False, what, "in the source but not decrypted from the vault")
            continue
        if rel not in expected:
            t.check(False, what, "decrypted from the vault but not in the source")
            continue
        ent, obj = got[rel]
        sst = os.lstat(expected[rel])
        vst = ent["stat"]
        kind = kind_of_mode(sst.st_mode, vault.special_kinds)
        t.check(kind == ent["kind"], f"{what}: kind", f"{KIND_NAMES[ent['kind']]} vs {KIND_NAMES[kind]}")
        if kind == KIND_FILE:
            with open(expected[rel], "rb") as f:
                t.check(obj == f.read(), f"{what}: contents")
            size_of, rule = (bm_cipher_size, "§5.10") if vault.block_map else (cipher_size, "§5.3")
            t.check(size_of(len(obj), vault.block_size, vault.aead.overhead) == vst.st_size,
                    f"{what}: ciphertext size matches {rule}")
        elif kind == KIND_SYMLINK:
            t.check(obj == os.readlink(expected[rel]), f"{what}: symlink target")
        if kind in (KIND_FILE, KIND_DIR):
            want = {n.encode(): os.getxattr(expected[rel], n) for n in os.listxattr(expected[rel]) if n.startswith("user.")}
            try:
                have = vault.read_xattrs(ent["cpath"], ent["identity"])
            except IntegrityError as e:
                have = {"integrity error": str(e)}
            t.check(have == want, f"{what}: user. attributes", f"{len(have)} vs {len(want)}")
        elif is_special(sst.st_mode):
            t.check(stat.S_IFMT(sst.st_mode) == stat.S_IFMT(vst.st_mode) and sst.st_rdev == vst.st_rdev,
                    f"{what}: special file type and device")
        if kind != KIND_SYMLINK:
            t.check(stat.S_IMODE(sst.st_mode) == stat.S_IMODE(vst.st_mode), f"{what}: mode",
                    f"{oct(stat.S_IMODE(vst.st_mode))} vs {oct(stat.S_IMODE(sst.st_mode))}")
        t.check(sst.st_mtime_ns == vst.st_mtime_ns, f"{what}: mtime")
        if verbose:
            print(f"ok   {KIND_NAMES[kind]:8} {what}")
    # Hard-link structure: the same partition of paths into inodes on both sides.
    def groups(pairs):
        by = {}
        for rel, key in pairs:
            by.setdefault(key, set()).add(rel)
        return sorted(sorted(g) for g in by.values() if len(g) > 1)
    src_groups = groups((r, (os.lstat(p).st_dev, os.lstat(p).st_ino)) for r, p in expected.items()
                        if not os.path.isdir(p) or os.path.islink(p))
    vault_groups = groups((r, (e["stat"].st_dev, e["stat"].st_ino)) for r, (e, _) in got.items()
                          if e["kind"] != KIND_DIR)
    t.check(src_groups == vault_groups, "hard-link structure", f"{vault_groups} vs {src_groups}")
    print(f"compared {len(got)} vault entries with {len(expected)} source entries "
          f"({vault.cfg['cipher']}, {vault.block_size}-byte blocks)")


# ---------------------------------------------------------------- tamper self-test

def tamper_selftest(vault_dir: str, secret_kind: str, secret: bytes, t: Tally):
    """Applies each tamper class of docs/SECURITY.md to a copy of the vault and checks that this
    reader reports an integrity error (or, for the documented gaps, that it does not)."""
    def fresh():
        d = tempfile.mkdtemp(prefix="rr-tamper-")
        dst = os.path.join(d, "v")
        subprocess.run(["cp", "-a", "--", vault_dir, dst], check=True)  # keeps FIFOs and hard links
        for dp, dns, fns in os.walk(dst):
            for n in dns + fns:
                p = os.path.join(dp, n)
                if not os.path.islink(p):
                    os.chmod(p, 0o700 if os.path.isdir(p) else 0o600)
        return d, dst

    def open_v(dst):
        return Vault.open(dst, password=secret if secret_kind == "password" else None,
                          recovery_key=secret if secret_kind == "recovery" else None)

    def entries(dst):
        v = open_v(dst)
        return v, {prel: ent for prel, ent, _ in v.walk()}

    def detected(dst):
        try:
            v = open_v(dst)
        except (ConfigError, WrongSecret):
            return True
        list(v.walk())
        return bool(v.errors)

    base_v, base = entries(vault_dir)
    B, O = base_v.block_size, base_v.aead.overhead
    # Where block n starts, and the header's length: v1 files (§5.1), or header v2 and the
    # block map's layout (§5.10) in a vault with "block-map".
    if base_v.block_map:
        H = H2
        def at(n):
            return bm_offset(n, B, O)
    else:
        H = HEADER_LEN
        def at(n):
            return HEADER_LEN + n * (B + O)
    files = sorted((p for p, e in base.items() if e["kind"] == KIND_FILE and e["stat"].st_nlink == 1),
                   key=lambda p: -base[p]["stat"].st_size)
    big, other = files[0], files[1]
    if base[big]["stat"].st_size < at(2) + 1:
        print("tamper self-test: needs a file of at least 3 blocks in the vault; skipped")
        return
    syms = [p for p, e in base.items() if e["kind"] == KIND_SYMLINK]
    dirs = [p for p, e in base.items() if e["kind"] == KIND_DIR]

    def rel_c(dst, prel):
        return os.path.join(os.fsencode(dst), os.path.relpath(base[prel]["cpath"], os.fsencode(vault_dir)))

    def mutate_bytes(fn):
        def go(dst, prel=big):
            p = rel_c(dst, prel)
            with open(p, "rb") as f:
                data = bytearray(f.read())
            data = fn(data)
            with open(p, "wb") as f:
                f.write(data)
        return go

    def flip(data):
        data[at(1) + 5] ^= 0x20
        return data

    def swap_blocks(data):
        a, b = at(0), at(1)
        data[a : a + B + O], data[b : b + B + O] = data[b : b + B + O], data[a : a + B + O]
        return data

    def zero_inner(data):
        data[at(1) : at(1) + B + O] = bytes(B + O)
        return data

    def set_sparse(data):
        data[3] |= 1
        return zero_inner(data)

    def swap_contents(dst):
        a, b = rel_c(dst, big), rel_c(dst, other)
        os.rename(a, a + b".tmp"); os.rename(b, a); os.rename(a + b".tmp", b)

    def swap_header(dst):
        a, b = rel_c(dst, big), rel_c(dst, other)
        with open(b, "rb") as f:
            hb = f.read(H)
        with open(a, "r+b") as f:
            f.write(hb)

    def move_block_between(dst):
        a, b = rel_c(dst, big), rel_c(dst, other)
        with open(b, "rb") as f:
            blk = f.read()[at(0) : at(0) + B + O]
        if len(blk) < B + O:  # other file shorter than a block: take the big file's own block 1 instead
            return swap_blocks_go(dst)
        with open(a, "r+b") as f:
            f.seek(at(0))
            f.write(blk)

    swap_blocks_go = mutate_bytes(swap_blocks)

    def move_entry(dst):
        sub = rel_c(dst, dirs[0])
        a = rel_c(dst, big)
        os.rename(a, os.path.join(sub, os.path.basename(a)))

    def copy_diriv(dst):
        # Copy the IV copy of one directory into another (gocryptfs audit 2.3 scenario): the
        # file veilfs.diriv, or with "iv-in-name" the empty file named after the IV.
        d1, d2 = rel_c(dst, dirs[0]), rel_c(dst, dirs[1])
        for n in os.listdir(d2):
            if n.startswith(b"veilfs.diriv"):
                os.unlink(os.path.join(d2, n))
        for n in os.listdir(d1):
            if n.startswith(b"veilfs.diriv"):
                shutil.copyfile(os.path.join(d1, n), os.path.join(d2, n))

    def swap_symlinks(dst):
        a, b = rel_c(dst, syms[0]), rel_c(dst, syms[1])
        ta = os.readlink(a)
        os.unlink(a)
        os.symlink(os.readlink(b), a)
        del ta

    def edit_config(dst):
        p = os.path.join(dst, "veilfs.conf")
        with open(p) as f:
            text = f.read()
        with open(p, "w") as f:
            f.write(text.replace('"creator": "veilfs', '"creator": "evilfs', 1))

    def raise_kdf_cost(dst):
        p = os.path.join(dst, "veilfs.conf")
        with open(p) as f:
            cfg = json.load(f)
        for s in cfg["slots"]:
            if s["kdf"]["algorithm"] == "argon2id":
                s["kdf"]["iterations"] += 1
        with open(p, "w") as f:
            json.dump(cfg, f, indent=2)

    def lower_kdf_cost(dst):
        p = os.path.join(dst, "veilfs.conf")
        with open(p) as f:
            cfg = json.load(f)
        for s in cfg["slots"]:
            if s["kdf"]["algorithm"] == "argon2id":
                s["kdf"]["memory_kib"] = max(8 * s["kdf"]["parallelism"], s["kdf"]["memory_kib"] // 2)
        with open(p, "w") as f:
            json.dump(cfg, f, indent=2)

    def truncate_to(n_of):
        def go(dst):
            p = rel_c(dst, big)
            os.truncate(p, n_of(os.path.getsize(p)))
        return go

    cases = [
        ("bit flip inside a block", mutate_bytes(flip), True),
        ("two blocks swapped within a file", swap_blocks_go, True),
        ("block copied from another file", move_block_between, True),
        ("zero block injected (no SPARSE flag)", mutate_bytes(zero_inner), True),
        ("SPARSE flag set by the attacker", mutate_bytes(set_sparse), True),
        ("header copied from another file", swap_header, True),
        ("whole files swapped by renaming", swap_contents, True),
        ("entry moved into another directory", move_entry, True),
        ("truncated at a block boundary", truncate_to(lambda c: at(1) + B + O), True),
        ("truncated inside a block", truncate_to(lambda c: c - 3), True),
        # Documented gap of v1 files (SECURITY.md §4, FORMAT.md §5.3): a header alone is an
        # empty file. A header v2 counts its blocks (§5.10): alone, it is an error.
        ("truncated to the header only" + ("" if base_v.block_map else " (documented gap: NOT detected)"),
         truncate_to(lambda c: H), base_v.block_map),
        ("config field edited", edit_config, True),
        ("slot Argon2 cost raised", raise_kdf_cost, True),
        ("slot Argon2 cost lowered", lower_kdf_cost, True),
        # Documented gap (SECURITY.md): a 0-byte ciphertext is a valid empty file.
        ("truncated to zero bytes (documented gap: NOT detected)", truncate_to(lambda c: 0), False),
    ]
    if len(dirs) >= 2:
        cases.append(("veilfs.diriv copied from another directory", copy_diriv, True))
    if len(syms) >= 2:
        cases.append(("symlink targets swapped", swap_symlinks, True))
    for what, fn, expect in cases:
        d, dst = fresh()
        try:
            fn(dst)
            got = detected(dst)
            t.check(got == expect, f"tamper: {what}", "detected" if got else "not detected")
            print(f"tamper {'detected    ' if got else 'not detected'}  {what}")
        finally:
            shutil.rmtree(d)


# ---------------------------------------------------------------- CLI

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vectors", help="check the known-answer vectors in this JSON file")
    ap.add_argument("--vault", help="a veilfs vault (CIPHERDIR) to decrypt")
    ap.add_argument("--password-file", help="password: the first line of this file")
    ap.add_argument("--recovery-key-file", help="recovery key (display form) in this file")
    ap.add_argument("--compare", help="plaintext tree the vault must equal")
    ap.add_argument("--tamper-selftest", action="store_true", help="tamper with copies of the vault and check detection")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if not a.vectors and not a.vault:
        ap.error("give --vectors and/or --vault")
    t = Tally()
    if a.vectors:
        before = t.passed + t.failed
        run_vectors(a.vectors, t)
        print(f"vectors: {t.passed + t.failed - before} checks")
    if a.vault:
        if a.recovery_key_file:
            with open(a.recovery_key_file) as f:
                kind, secret = "recovery", recovery_parse(f.read())
        elif a.password_file:
            with open(a.password_file, "rb") as f:
                text = f.read()
            cut = min([i for i in (text.find(b"\n"), text.find(b"\r")) if i >= 0], default=len(text))
            kind, secret = "password", text[:cut]
        else:
            ap.error("--vault needs --password-file or --recovery-key-file")
        try:
            v = Vault.open(a.vault, password=secret if kind == "password" else None,
                           recovery_key=secret if kind == "recovery" else None)
        except (ConfigError, WrongSecret) as e:
            t.check(False, "unlock", str(e))
            print(f"{t.passed} passed, {t.failed} failed")
            return 1
        t.check(True, "unlock")
        if a.compare:
            compare(v, a.compare, t, a.verbose)
        else:
            for prel, ent, obj in v.walk():
                extra = f" -> {obj!r}" if ent["kind"] == KIND_SYMLINK else (f" {len(obj)} bytes" if obj is not None else "")
                print(f"{KIND_NAMES[ent['kind']]:8} {prel!r}{extra}")
            for path, msg in v.errors:
                t.check(False, "vault error", f"{path!r}: {msg}")
        if a.tamper_selftest:
            tamper_selftest(a.vault, kind, secret, t)
    print(f"{t.passed} passed, {t.failed} failed")
    return 0 if t.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
