"""Shared test fixtures: the committed H200 captures and their raw CSV oracles."""

from __future__ import annotations

import csv
import io
import lzma
import re
import sys
from functools import cache
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "h200"


def _gpu_available() -> bool:
    # Asks the driver through ctypes: importing CuPy here would load it into every test.
    from perfscope.kernels.launch import driver_device_count

    return driver_device_count() > 0


if not _gpu_available():
    # Without a GPU, CuPy (if installed) only imports; the report reader must still come
    # first, or its first string call crashes. With a GPU the two cannot share a process
    # in either order (seen on the H200): run the gpu tests that use CuPy on their own.
    import ncu_report  # noqa: F401


def pytest_ignore_collect(collection_path, config):
    """Under ``-m gpu`` a test module with no gpu test is not even imported: the CPU modules
    load Nsight Compute's report reader, and CuPy cannot run beside it."""
    if (config.getoption("markexpr", "") != "gpu" or collection_path.suffix != ".py"
            or not collection_path.name.startswith("test_")):
        return None
    return True if "pytest.mark.gpu" not in collection_path.read_text() else None


def cupy_refusal(gpu: bool, reader_loaded: bool) -> str | None:
    """Why the tests marked cupy cannot run in this process, None when they can."""
    if not gpu or not reader_loaded:
        return None
    return ("Nsight Compute's report reader is loaded in this pytest process (a collected module "
            "imports it) and CuPy cannot run beside it: run the GPU test files one per process, "
            "python -m pytest -m gpu tests/FILE.py")


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        refusal = cupy_refusal(True, "ncu_report" in sys.modules)
        if refusal is not None:
            skip = pytest.mark.skip(reason=refusal)
            for item in items:
                if "cupy" in item.keywords:
                    item.add_marker(skip)
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def benchmark_script(name: str):
    """benchmarks/NAME.py as a module (the scripts import no GPU library at import time)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def fresh_python(code: str, timeout: int = 300) -> str:
    """What `python -c code` prints in a fresh interpreter at the checkout's root (for what
    a test process, which has loaded everything already, cannot show: import order, the
    modules a page loads); its failure fails the test with the interpreter's stderr."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def report(name: str) -> Path:
    return FIXTURES / f"{name}.ncu-rep.xz"


@cache
def raw_csv(name: str) -> list[dict[str, tuple[str, str]]]:
    """The `ncu --import F --page raw --csv --print-units base` rows: column -> (value, unit)."""
    with lzma.open(FIXTURES / f"{name}.raw.csv.xz", "rt") as f:
        text = f.read()
    rows = list(csv.reader(io.StringIO(text)))
    header, units = rows[0], rows[1]
    return [{h: (v, u) for h, u, v in zip(header, units, row, strict=True)} for row in rows[2:]]


_NUM = re.compile(r"^-?[\d,]+(\.\d+)?$")


def csv_number(row: dict[str, tuple[str, str]], column: str) -> float | None:
    """A numeric cell of the oracle, None when the column is absent or not a number."""
    if column not in row:
        return None
    text = row[column][0].strip()
    if not _NUM.match(text):
        return None
    return float(text.replace(",", ""))


@pytest.fixture(scope="module")
def private_cubin_cache(tmp_path_factory):
    """A module's compiles run for real instead of reading a developer's cubin cache
    (use with ``pytestmark = pytest.mark.usefixtures("private_cubin_cache")``)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PERFSCOPE_CACHE", str(tmp_path_factory.mktemp("cubins")))
    yield
    mp.undo()


def disassembler_or_skip():
    """The SASS disassembler, or a clean skip that says how to install one."""
    from perfscope.errors import PerfscopeError
    from perfscope.sass import disasm

    try:
        return disasm.find_tool()
    except PerfscopeError as exc:
        pytest.skip(str(exc))
