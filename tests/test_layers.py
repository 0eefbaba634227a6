"""The house's floors, checked over perfscope's own import graph (read from the source).

Data flows one way: KernelSpec -> ncu -> .ncu-rep -> Diagnosed -> diff/review -> render.
So:
- nothing on a floor imports a module of a floor above it, and no two modules import
  each other, directly or around a loop;
- the analysis (rules, the record, diff, review, the renderers) imports neither the kernel
  registry and its launchers, nor the compiler, nor ncu and the profiler;
- an import inside a function names a perfscope module only in the CLI, and only with a
  ``# deferred:`` reason (a heavy or conflicting dependency loaded on demand);
- a process that runs kernels never loads Nsight Compute's report reader.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "perfscope"

# Floors, lowest first. A module may import its own floor and those below.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "cache", "metrics", "families", "stage", "locations", "version", "digest",
     "hardware", "tensormaps"),
    ("reader", "manifest", "sass", "sass.disasm", "sass.loops", "sass.embedded", "sass.operands",
     "kernels.spec", "kernels.weights", "kernels.tcgen05", "bandwidth"),
    ("profile", "source", "structure", "hotloop"),
    ("rules", "rules.*"),
    ("record", "diff", "documents"),
    ("kernels", "kernels.registry", "kernels.fused_specs", "kernels.epilogue", "kernels.fp8",
     "kernels.listing", "kernels.maps"),
    ("diagnosis", "review", "calibration", "loadpool"),
    ("render", "render.*"),
    ("export",),
    ("build", "kernels.tensormap", "kernels.launch", "verify", "environment", "timing", "bench",
     "collection", "ncu", "runner", "profiling", "audit", "tune", "tune.*", "mapcapture"),
    ("cli", "__init__"),
)
# What the analysis must never reach for.
ANALYSIS = ("rules", "rules.*", "record", "diff", "review", "render", "render.*", "profile",
            "reader", "manifest", "metrics", "families", "documents", "export", "stage", "source",
            "structure", "digest", "hardware", "calibration", "bandwidth", "tensormaps", "hotloop",
            "loadpool")
PROFILER_SIDE = ("kernels", "kernels.*", "build", "ncu", "profiling", "runner", "bench",
                 "collection", "verify", "timing", "environment", "tune", "tune.*", "audit", "cli",
                 "mapcapture")
# The one loader may name the registry to attach StageInfo to a record; it does not run it.
LOADER_MAY = {"diagnosis": ("kernels",)}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] or ["__init__"]
    return ".".join(parts)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(name == p or (p.endswith(".*") and name.startswith(p[:-1])) for p in patterns)


def _floor(name: str) -> int:
    for i, floor in enumerate(FLOORS):
        if _matches(name, floor):
            return i
    raise AssertionError(f"perfscope.{name} is on no floor: add it to FLOORS")


def _target(node: ast.ImportFrom | ast.Import, here: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = here.split(".")[: -node.level] if here != "__init__" else []
        return [".".join([*base, node.module or ""]).strip(".")]
    mod = node.module or ""
    if mod == "perfscope":
        # `from perfscope import x`: the module x, or a name of the package's __init__.
        return [f"perfscope.{a.name}" if (PACKAGE / a.name).exists()
                or (PACKAGE / f"{a.name}.py").exists() else "perfscope" for a in node.names]
    return [mod]


class _Imports(ast.NodeVisitor):
    def __init__(self, here: str) -> None:
        self.here = here
        self.module_level: list[tuple[str, int]] = []
        self.in_function: list[tuple[str, int]] = []
        self.typing_only: list[tuple[str, int]] = []
        self._depth = 0
        self._typing = 0

    def _add(self, node: ast.Import | ast.ImportFrom) -> None:
        for t in _target(node, self.here):
            if not t.startswith("perfscope"):
                continue
            name = t[len("perfscope."):] if t != "perfscope" else "__init__"
            if self._typing:
                self.typing_only.append((name, node.lineno))
            elif self._depth:
                self.in_function.append((name, node.lineno))
            else:
                self.module_level.append((name, node.lineno))

    visit_Import = visit_ImportFrom = _add

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        typing = isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        self._typing += typing
        for child in node.body:
            self.visit(child)
        self._typing -= typing
        for child in node.orelse:
            self.visit(child)


@cache
def graph() -> dict[str, _Imports]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        visitor = _Imports(name)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        out[name] = visitor
    return out


def _resolve(name: str) -> str:
    """'kernels.get_spec' style targets ('from perfscope.kernels import x') stay 'kernels'."""
    known = graph()
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_every_module_has_a_floor():
    for name in graph():
        _floor(name)


def test_nothing_imports_upward():
    bad = []
    for name, imp in graph().items():
        for target, line in imp.module_level + imp.in_function + imp.typing_only:
            t = _resolve(target)
            if t == name or name == "__init__":
                continue
            if _floor(t) > _floor(name):
                bad.append(f"perfscope/{name}:{line} imports {t} (floor {_floor(t)} > {_floor(name)})")
    assert not bad, "\n".join(bad)


def test_analysis_never_reaches_the_profiler_side():
    bad = []
    for name, imp in graph().items():
        if not _matches(name, ANALYSIS) and name not in LOADER_MAY:
            continue
        allowed = LOADER_MAY.get(name, ())
        for target, line in imp.module_level + imp.in_function + imp.typing_only:
            t = _resolve(target)
            if _matches(t, PROFILER_SIDE) and t not in allowed:
                bad.append(f"perfscope/{name}:{line} imports {t}")
    assert not bad, "\n".join(bad)


def test_no_import_loop():
    edges = {name: {_resolve(t) for t, _ in imp.module_level} - {name} for name, imp in graph().items()}
    # A package's __init__ re-exporting its modules is not a loop through them.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if m.startswith(n + ".") or n.startswith(m + "."):
                continue
            if state.get(m) == 1:
                loop = [*stack[stack.index(m):], m]
                raise AssertionError("import loop: " + " -> ".join(loop))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)


def test_function_level_imports_are_deferred_on_purpose():
    bad = []
    for name, imp in graph().items():
        if not imp.in_function:
            continue
        lines = (PACKAGE / (name.replace(".", "/") + ".py")).read_text().splitlines() \
            if (PACKAGE / (name.replace(".", "/") + ".py")).exists() else \
            (PACKAGE / name.replace(".", "/") / "__init__.py").read_text().splitlines()
        for _target_name, line in imp.in_function:
            text = lines[line - 1]
            if name != "cli" or "# deferred:" not in text:
                bad.append(f"perfscope/{name}:{line}: {text.strip()}")
    assert not bad, "function-level imports of perfscope modules:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", ["perfscope.bench", "perfscope.runner", "perfscope.timing"])
def test_processes_that_run_kernels_never_load_the_report_reader(module):
    code = (f"import sys, {module}; "
            "print(','.join(m for m in ('ncu_report', 'perfscope.profile', 'matplotlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("script", ["bench_h200", "bench_fused", "tune_h200", "fused_check", "hmma_ceiling",
                                    "wgmma_ceiling", "power_probe", "energy_per_launch",
                                    "sustained_clock"])
def test_benchmarks_that_run_kernels_never_load_the_report_reader(script):
    # The reference run starts these as processes of their own so that CuPy may load in
    # them; a module-level import that pulls in the reader would make their bench refuse.
    root = PACKAGE.parent
    code = (f"import sys; sys.path[:0] = [{str(root)!r}, {str(root / 'benchmarks')!r}]; "
            f"import {script}; "
            "print(','.join(m for m in ('ncu_report', 'perfscope.profile', 'matplotlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_a_gpu_run_collects_only_the_modules_with_gpu_tests():
    """`pytest -m gpu tests/` imports no CPU-only module (they load the report reader, beside
    which CuPy cannot run); where a collected module still loads it on a GPU machine, the
    CuPy tests are skipped with the sentence that says to run the files one per process."""
    from conftest import cupy_refusal

    tests = PACKAGE.parent / "tests"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu",
                          "-p", "no:cacheprovider", str(tests)],
                         capture_output=True, text=True, cwd=PACKAGE.parent, check=False)
    files = {line.split("::", 1)[0].rsplit("/", 1)[-1] for line in out.stdout.splitlines()
             if "::" in line}
    with_gpu = {p.name for p in tests.glob("test_*.py") if "pytest.mark.gpu" in p.read_text()}
    assert files and files <= with_gpu, (files - with_gpu, out.stdout[-2000:])
    assert {"test_gpu_bench.py", "test_gpu_profile.py"} <= files
    assert cupy_refusal(False, True) is None and cupy_refusal(True, False) is None
    assert "one per process" in cupy_refusal(True, True)
