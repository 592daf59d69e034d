"""The three fscrypt ioctls the benchmark needs, called directly.

Debian 12 has no ``fscryptctl`` package and the ``fscrypt`` tool wants a
global ``/etc/fscrypt.conf`` plus metadata on the filesystem; for a throw-away
ext4 image, adding a raw 64-byte v2 master key and setting a v2 policy on one
directory is all that is needed, and it is a few lines with ``fcntl.ioctl``.
The layouts follow ``include/uapi/linux/fscrypt.h``.
"""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

FS_IOC_SET_ENCRYPTION_POLICY = 0x800C6613   # _IOR('f', 19, struct fscrypt_policy_v1)
FS_IOC_ADD_ENCRYPTION_KEY = 0xC0506617      # _IOWR('f', 23, struct fscrypt_add_key_arg)
FS_IOC_REMOVE_ENCRYPTION_KEY = 0xC0406618   # _IOWR('f', 24, struct fscrypt_remove_key_arg)

KEY_SPEC_TYPE_IDENTIFIER = 2
POLICY_V2 = 2
MODE_AES_256_XTS = 1
MODE_AES_256_CTS = 4
POLICY_FLAGS_PAD_32 = 0x03


def _key_spec(identifier: bytes = b"") -> bytes:
    """struct fscrypt_key_specifier: type, reserved, 32-byte union."""
    return struct.pack("=II32s", KEY_SPEC_TYPE_IDENTIFIER, 0, identifier)


def add_key(mountpoint: Path, raw_key: bytes) -> bytes:
    """Add a v2 master key to the filesystem at *mountpoint*; returns the
    16-byte key identifier the kernel derived from it."""
    arg = bytearray(_key_spec() + struct.pack("=II32x", len(raw_key), 0) + raw_key)
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_ADD_ENCRYPTION_KEY, arg, True)
    finally:
        os.close(fd)
    return bytes(arg[8:24])


def set_policy(directory: Path, identifier: bytes) -> None:
    """Make the empty *directory* encrypted with the key *identifier*."""
    policy = struct.pack("=BBBB4x16s", POLICY_V2, MODE_AES_256_XTS, MODE_AES_256_CTS,
                         POLICY_FLAGS_PAD_32, identifier)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_SET_ENCRYPTION_POLICY, policy)
    finally:
        os.close(fd)


def remove_key(mountpoint: Path, identifier: bytes) -> None:
    arg = bytearray(_key_spec(identifier) + struct.pack("=I20x", 0))
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_REMOVE_ENCRYPTION_KEY, arg, True)
    finally:
        os.close(fd)
