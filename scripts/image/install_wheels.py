"""Installs wheels into a new virtual environment with the standard library alone: no pip, no setuptools, so the
image holds no build tools and its base needs no venv package (Debian's python3-venv only adds pip's wheels).

A wheel is a zip file laid out for site-packages; installing one is unpacking it there (its `*.data/` folders to
their schemes), writing its console scripts, and compiling its bytecode. Parts of packages that nothing imports
at run time are left out (PRUNED): test suites, type stubs, C headers, numpy's f2py, and the numpy subpackages the
exporter never uses (random, fft; _simd is numpy's own SIMD test module). tests/test_image.py checks that the
exporter's code names none of them and runs the image's exporter to check that it still serves.

usage: python3 install_wheels.py PREFIX WHEEL...
"""

from __future__ import annotations

import compileall
import configparser
import fnmatch
import os
import py_compile
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path, PurePosixPath

NUMPY_LEFT_OUT = ("random", "fft", "typing", "f2py", "distutils")  # subpackages: tests/test_image.py reads this
PRUNED = ("*/tests", "*/tests/*", "*.pyi", "numpy/_core/include/*", "numpy/_pyinstaller/*", "numpy/conftest.py",
          "numpy/_core/_simd.*", *(f"numpy/{p}/*" for p in NUMPY_LEFT_OUT))


def _pruned(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in PRUNED)


def install(wheel: Path, prefix: Path, site: Path) -> list[tuple[str, str]]:
    """Unpacks `wheel`; returns its console scripts as (name, 'module:function')."""
    schemes = {"purelib": site, "platlib": site, "scripts": prefix / "bin", "data": prefix}
    scripts: list[tuple[str, str]] = []
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = PurePosixPath(info.filename)
            if info.is_dir() or path.is_absolute() or ".." in path.parts:
                continue
            root, rel = site, path
            if path.parts[0].endswith(".data") and len(path.parts) > 2:
                if path.parts[1] not in schemes:
                    continue  # headers: nothing compiles against the image
                root, rel = schemes[path.parts[1]], PurePosixPath(*path.parts[2:])
            if root is site and _pruned(str(rel)):
                continue
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = info.external_attr >> 16
            os.chmod(target, 0o755 if mode & 0o111 else 0o644)
            if path.name == "entry_points.txt" and path.parent.name.endswith(".dist-info"):
                entry = configparser.ConfigParser(delimiters=("=",))
                entry.optionxform = str  # type: ignore[assignment,method-assign]  # names keep their case
                entry.read(target)
                if entry.has_section("console_scripts"):
                    scripts += [(k, v.strip()) for k, v in entry.items("console_scripts")]
    return scripts


def write_script(prefix: Path, name: str, target: str) -> None:
    module, _, func = target.partition(":")
    path = prefix / "bin" / name
    path.write_text(f"#!{prefix / 'bin' / 'python3'}\nimport sys\nfrom {module} import {func.split('.')[0]}\n"
                    f"sys.exit({func}())\n")
    path.chmod(0o755)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.rsplit("usage: ", 1)[1], file=sys.stderr)
        return 2
    prefix, wheels = Path(argv[0]), [Path(w) for w in argv[1:]]
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(prefix)
    # as the environment's own interpreter sees it (Debian's python3 defaults to another scheme outside one)
    site = Path(subprocess.run([str(prefix / "bin" / "python3"), "-c", "import sysconfig; "
                                "print(sysconfig.get_path('purelib'))"], check=True, capture_output=True,
                               text=True).stdout.strip())
    scripts = []
    for wheel in sorted(wheels):
        scripts += install(wheel, prefix, site)
    for name, target in scripts:
        write_script(prefix, name, target)
    # Bytecode now, checked by hash without looking at the source: the image's root file system is read-only
    # and unchanging, so nothing is compiled at start
    ok = compileall.compile_dir(site, quiet=1, workers=0,
                                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
