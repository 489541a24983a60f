"""Strips the debugging information from the shared objects in wheels, as Debian strips the binaries it packages:
the image runs them and never debugs them, and some projects ship theirs unstripped (about 10 MB of the image's
wheels). The code is the same bytes (`strip --strip-debug` leaves symbols and code alone); each changed file's
line in the wheel's RECORD is written again, so the wheel stays valid. A wheel with nothing to strip is left
untouched. A library that strip would leave unloadable is kept as it came: strip rewrites the file layout of
objects that patchelf edited (auditwheel's vendored libraries, numpy's OpenBLAS among them) so that a loadable
segment's file offset and address disagree modulo its alignment, and the dynamic loader then refuses it ("ELF load
command address/offset not page-aligned"). Needs binutils' `strip` for the wheels' architecture on the machine
that builds (STRIP names it: scripts/image/build.sh sets aarch64-linux-gnu-strip for arm64 on amd64, from
binutils-aarch64-linux-gnu).

usage: python3 strip_wheels.py WHEEL...
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


_PT_LOAD = 1


def loadable(data: bytes) -> bool:
    """Whether every loadable segment of an ELF object has its file offset and its address congruent modulo its
    alignment: what the dynamic loader checks before it maps one."""
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return False
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        if wide:
            phoff, = struct.unpack_from(order + "Q", data, 0x20)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 0x36)
        else:
            phoff, = struct.unpack_from(order + "I", data, 0x1C)
            phentsize, phnum = struct.unpack_from(order + "HH", data, 0x2A)
        for i in range(phnum):
            at = phoff + i * phentsize
            if wide:
                kind, _, offset, vaddr, _, _, _, align = struct.unpack_from(order + "IIQQQQQQ", data, at)
            else:
                kind, offset, vaddr, _, _, _, _, align = struct.unpack_from(order + "IIIIIIII", data, at)
            if kind == _PT_LOAD and align > 1 and offset % align != vaddr % align:
                return False
    except struct.error:
        return False  # program headers past the end of the file
    return True


def _stripped(data: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "lib.so")
        path.write_bytes(data)
        subprocess.run([os.environ.get("STRIP", "strip"), "--strip-debug", str(path)], check=True,
                       capture_output=True)
        return path.read_bytes()


def strip_wheel(wheel: Path) -> int:
    """Rewrites `wheel` with its shared objects stripped; returns the bytes saved."""
    with zipfile.ZipFile(wheel) as z:
        members = [(info, z.read(info)) for info in z.infolist()]
    changed: dict[str, bytes] = {}
    for info, data in members:
        name = os.path.basename(info.filename)
        if (name.endswith(".so") or ".so." in name) and data[:4] == b"\x7fELF":
            new = _stripped(data)
            if len(new) < len(data) and not loadable(new):
                print(f"strip_wheels: {wheel.name}: {info.filename} kept unstripped (stripped, the loader would "
                      "refuse it)", file=sys.stderr)
            elif len(new) < len(data):
                changed[info.filename] = new
    if not changed:
        return 0
    out = wheel.with_suffix(".part")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in members:
            if info.filename in changed:
                data = changed[info.filename]
            elif info.filename.endswith(".dist-info/RECORD") and info.filename.count("/") == 1:
                lines = []
                for line in data.decode().splitlines():
                    name = line.rsplit(",", 2)[0]
                    lines.append(_record_line(name, changed[name]) if name in changed else line)
                data = ("\n".join(lines) + "\n").encode()
            z.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    os.replace(out, wheel)
    return sum(len(d) for i, d in members if i.filename in changed) - sum(len(d) for d in changed.values())


def main(argv: list[str]) -> int:
    saved = sum(strip_wheel(Path(w)) for w in argv)
    print(f"strip_wheels: {saved / 1e6:.1f} MB of debugging information left out", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
