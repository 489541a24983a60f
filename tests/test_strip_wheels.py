"""scripts/image/strip_wheels.py on the real libraries the image ships: what it strips still loads, and a library
that strip would leave unloadable (numpy's OpenBLAS, edited by patchelf when its wheel was repaired) is kept as it
came. The image built from stripped wheels failed at `import numpy` when it was not."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy
import pytest
import yaml
from conftest import IN_CI, REPO, require_binary

sys.path.insert(0, str(REPO / "scripts" / "image"))
import strip_wheels

NUMPY_LIBS = Path(numpy.__file__).resolve().parent.parent / "numpy.libs"
YAML_EXTENSION = next(Path(yaml.__file__).parent.glob("_yaml*.so"), None)


def _wheel(tmp_path: Path, files: dict[str, bytes]) -> Path:
    wheel = tmp_path / "demo-1.0-py3-none-linux_x86_64.whl"
    records = [strip_wheels._record_line(name, data) for name, data in files.items()]
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("demo-1.0.dist-info/RECORD", "\n".join([*records, "demo-1.0.dist-info/RECORD,,"]) + "\n")
    return wheel


def _loads(path: Path) -> subprocess.CompletedProcess:
    """The dynamic loader's own answer, in a process of its own (a library it maps stays mapped)."""
    return subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(path)!r})"],
                          capture_output=True, text=True, timeout=60)


def test_stripped_wheel_loads_and_keeps_what_strip_would_break(tmp_path, capsys) -> None:
    require_binary("strip")
    if not NUMPY_LIBS.is_dir() or YAML_EXTENSION is None:  # the wheels from PyPI, as setup.sh installs, have both
        (pytest.fail if IN_CI else pytest.skip)("numpy or PyYAML installed without their vendored libraries")
    files = {f"numpy.libs/{p.name}": p.read_bytes() for p in NUMPY_LIBS.iterdir()}
    files[f"yaml/{YAML_EXTENSION.name}"] = YAML_EXTENSION.read_bytes()
    blas = next(name for name in files if "openblas" in name)
    # the case itself: strip rewrites this library so that the loader refuses it
    assert not strip_wheels.loadable(strip_wheels._stripped(files[blas]))

    wheel = _wheel(tmp_path, files)
    saved = strip_wheels.strip_wheel(wheel)
    with zipfile.ZipFile(wheel) as z:
        after = {name: z.read(name) for name in files}
        record = z.read("demo-1.0.dist-info/RECORD").decode()
    assert after[blas] == files[blas]
    assert f"{blas} kept unstripped" in capsys.readouterr().err  # said, not silently left larger
    yaml_name = f"yaml/{YAML_EXTENSION.name}"
    assert len(after[yaml_name]) < len(files[yaml_name]) and saved > 0
    for name, data in after.items():  # the wheel stays valid: RECORD says each file's new hash and size
        assert strip_wheels._record_line(name, data) in record.splitlines()
    out = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(out)
    for name in (blas, yaml_name):
        r = _loads(out / name)
        assert r.returncode == 0, f"{name}: {r.stderr[-1500:]}"


def test_loadable_reads_the_program_headers_the_loader_checks(tmp_path) -> None:
    libc = ctypes.util.find_library("c")
    path = next(p for p in (Path("/lib/x86_64-linux-gnu") / (libc or "libc.so.6"), Path("/usr/lib") / "libc.so.6",
                            Path(sys.executable).resolve()) if p.exists())
    data = path.read_bytes()
    assert strip_wheels.loadable(data)
    assert not strip_wheels.loadable(b"\x7fELF" + b"\x02\x01" + b"\x00" * 10)  # headers past the end
    assert not strip_wheels.loadable(b"MZ" + data[2:])
