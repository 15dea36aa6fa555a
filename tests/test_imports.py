"""The package's imports as its source writes them (read with `ast`, imports inside functions included): what
may touch the GPU, and that no two modules need each other.

The graph is built from the files, not by importing them, so it sees the imports a CPU machine never runs.
"""
from __future__ import annotations

import ast
import pathlib

import cublaslt_probe

PACKAGE = pathlib.Path(cublaslt_probe.__file__).parent
ROOT = "cublaslt_probe"


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package (a package is its __init__.py)."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = (ROOT,) + p.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) of each import statement of module `name`; `from X import y`
    names X.y when that is a module of the package, else X. At module level: not inside a function body."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []

    def visit(node, top: bool):
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    out.append((sub if sub in MODULES else base, child.lineno, top))
            visit(child, inner)

    visit(tree, True)
    return out


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _graph(module_level_only: bool, within: str = ROOT) -> dict[str, set[str]]:
    return {m: {t for t, _, top in imps if t in MODULES and t != m and t.startswith(within)
                and (top or not module_level_only)}
            for m, imps in IMPORTS.items() if m.startswith(within)}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_graph_sees_the_imports_inside_functions():
    """The reader finds a known function-level import (write's Parquet stream types its batches as
    `frame.records_to_frame` does) and a known module-level one."""
    write = IMPORTS["cublaslt_probe.logs.write"]
    assert ("cublaslt_probe.logs.frame", False) in {(t, top) for t, _, top in write}
    assert ("cublaslt_probe.logs.record", True) in {(t, top) for t, _, top in write}


def test_logs_has_no_import_circle_even_through_functions():
    """logs/ is a chain: _io and record at the bottom, parser and cublas over them, write and frame on top
    (write may reach frame, never the other way), so no two of its modules need each other."""
    assert _circles(_graph(module_level_only=False, within=f"{ROOT}.logs")) == []


# The modules that may run GPU code: the package `gpu` (they import torch or cupy inside functions, load CUDA
# libraries through ctypes, or drive the GPU through the probe's torch). Everything else runs on a CPU.
GPU_PACKAGE = f"{ROOT}.gpu"
GPU_MODULES = {m for m in MODULES if m == GPU_PACKAGE or m.startswith(GPU_PACKAGE + ".")}
GPU_LIBRARIES = {"torch", "cupy", "ctypes"}   # ctypes: how lt, driver and cupti load libcublasLt, libcuda, CUPTI


def _dynamic_imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """`importlib.import_module("x")` and `__import__("x")` with a literal name: (x, line)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if fname in ("import_module", "__import__"):
                out.append((node.args[0].value, node.lineno))
    return out


def test_only_the_gpu_modules_import_torch_cupy_or_ctypes():
    """Outside `GPU_MODULES` no module imports torch, cupy or ctypes, at module level or in a function."""
    bad = [f"{m}:{line} imports {t}" for m, imps in IMPORTS.items() if m not in GPU_MODULES
           for t, line, _ in imps if t.split(".")[0] in GPU_LIBRARIES]
    bad += [f"{m}:{line} imports {t}" for m, p in MODULES.items() if m not in GPU_MODULES
            for t, line in _dynamic_imports(p) if t.split(".")[0] in GPU_LIBRARIES]
    assert bad == []
    assert f"{GPU_PACKAGE}.probe" in GPU_MODULES     # the rule reads the package that exists


def test_gpu_modules_import_on_a_cpu():
    """The GPU modules import torch and cupy only inside functions, so that importing them (for their CPU
    halves, their names in the CLI's help) needs neither."""
    top = [f"{m}:{line} imports {t} at module level" for m in sorted(GPU_MODULES)
           for t, line, at_top in IMPORTS[m] if at_top and t.split(".")[0] in ("torch", "cupy")]
    assert top == []


def test_no_import_circle_at_module_level():
    """No two modules of the package import each other (directly or round a loop) at module level."""
    assert _circles(_graph(module_level_only=True)) == []


CPU_PACKAGES = [f"{ROOT}.{p}" for p in ("analysis", "render", "sweep", "names", "logs")] + \
    [f"{ROOT}.{m}" for m in ("vocab", "dtypes", "cases", "runfiles", "streams", "errors")]


def test_the_cpu_side_never_reaches_into_gpu():
    """analysis/, render/, sweep/, names/, logs/ and the shared vocabulary import nothing from gpu/, not even
    inside a function: what runs on the GPU is called by the CLI (and the recorder by the program), never by
    the code that reads what it wrote. A rule both sides need lives on the CPU side (evidence, runfiles)."""
    bad = [f"{m}:{line} imports {t}" for m, imps in IMPORTS.items()
           if any(m == p or m.startswith(p + ".") for p in CPU_PACKAGES)
           for t, line, _ in imps if t == GPU_PACKAGE or t.startswith(GPU_PACKAGE + ".")]
    assert bad == []
    assert all(p in MODULES for p in CPU_PACKAGES)


# The GPU modules that time with CUDA events of their own, beside `gpu/timing.py`: prove's A/B rounds (its step
# loop is the proof's method, docs/prove.md). Every other timing loop lives in gpu/timing.py.
EVENT_TIMERS = {f"{GPU_PACKAGE}.timing", f"{GPU_PACKAGE}.prove"}


def test_every_timing_loop_is_in_gpu_timing():
    """No GPU module but `EVENT_TIMERS` reads an event's elapsed time (`elapsed_time`, torch's; the driver's
    `elapsed_us` is the clock `timing.Timer` reads through): a new loop goes to gpu/timing.py, saying the evidence
    it gives."""
    bad = []
    for m in sorted(GPU_MODULES - EVENT_TIMERS):
        tree = ast.parse(MODULES[m].read_text(), str(MODULES[m]))
        bad += [f"{m}:{n.lineno}" for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and n.attr == "elapsed_time"]
    assert bad == []


def test_what_audit_measure_measures_is_planned_on_the_cpu():
    """The plan of `audit --measure` (cases, what-ifs, the experts problem) and the typed measurement import no
    GPU code at all, not even in a function, and gpu.measure takes its plan from there."""
    for m in ("analysis.audit.plan", "analysis.audit.measurement"):
        targets = {t for t, _, _ in IMPORTS[f"{ROOT}.{m}"]}
        assert not any(t == GPU_PACKAGE or t.startswith(GPU_PACKAGE + ".") or t.split(".")[0] in GPU_LIBRARIES
                       for t in targets), (m, targets)
    assert f"{ROOT}.analysis.audit.plan" in {t for t, _, top in IMPORTS[f"{GPU_PACKAGE}.measure"] if top}
