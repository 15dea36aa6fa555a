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
    assert {f"{GPU_PACKAGE}.{m}" for m in ("probe", *PROBE_PARTS)} <= GPU_MODULES   # the rule reads what exists


# The probe's parts (gpu/probe.py is the window scheduler over them).
PROBE_PARTS = ("operands", "kernel_capture", "heuristic_helpers", "host", "alternatives")


def test_the_probes_parts_never_import_the_scheduler():
    """operands, kernel_capture, heuristic_helpers, host and alternatives sit below gpu/probe.py: none imports it,
    not even for an annotation, so the scheduler is the only module that needs them all."""
    bad = [f"{GPU_PACKAGE}.{part}:{line}" for part in PROBE_PARTS
           for t, line, _ in IMPORTS[f"{GPU_PACKAGE}.{part}"] if t == f"{GPU_PACKAGE}.probe"]
    assert bad == []


def test_gpu_modules_import_on_a_cpu():
    """The GPU modules import torch and cupy only inside functions, so that importing them (for their CPU
    halves, their names in the CLI's help) needs neither."""
    top = [f"{m}:{line} imports {t} at module level" for m in sorted(GPU_MODULES)
           for t, line, at_top in IMPORTS[m] if at_top and t.split(".")[0] in ("torch", "cupy")]
    assert top == []


def test_no_import_circle_even_through_functions():
    """No two modules of the package import each other, directly or round a loop, at module level, inside a
    function or for an annotation: every module sits above the ones it uses."""
    assert _circles(_graph(module_level_only=False)) == []


CPU_PACKAGES = [f"{ROOT}.{p}" for p in ("analysis", "render", "sweep", "names", "logs")] + \
    [f"{ROOT}.{m}" for m in ("vocab", "dtypes", "cases", "raw_record", "runfiles", "streams", "errors")]


def test_the_cpu_side_never_reaches_into_gpu():
    """analysis/, render/, sweep/, names/, logs/ and the shared vocabulary import nothing from gpu/, not even
    inside a function: what runs on the GPU is called by the CLI (and the recorder by the program), never by
    the code that reads what it wrote. A rule both sides need lives on the CPU side (evidence, runfiles)."""
    bad = [f"{m}:{line} imports {t}" for m, imps in IMPORTS.items()
           if any(m == p or m.startswith(p + ".") for p in CPU_PACKAGES)
           for t, line, _ in imps if t == GPU_PACKAGE or t.startswith(GPU_PACKAGE + ".")]
    assert bad == []
    assert all(p in MODULES for p in CPU_PACKAGES)


def _in(m: str, packages: list[str]) -> bool:
    return any(m == p or m.startswith(p + ".") for p in packages)


def test_the_cpu_side_starts_no_program():
    """The CPU side does not import subprocess: a program it started (a cold-start child) would run GPU work
    outside gpu/; the runner that starts `cold-start`'s children is `gpu.coldstart`, beside the child. (A pool of
    worker processes running the CPU side's own functions, as the sweep's row builders, is CPU work.)"""
    bad = [f"{m}:{line} imports {t}" for m, imps in IMPORTS.items() if _in(m, CPU_PACKAGES)
           for t, line, _ in imps if t.split(".")[0] == "subprocess"]
    assert bad == []
    assert any(t == "subprocess" for t, _, _ in IMPORTS[f"{GPU_PACKAGE}.coldstart"])   # the rule reads the runner


def _sys_modules_lookups(path: pathlib.Path) -> list[tuple[str, int]]:
    """`sys.modules.get("x")` and `sys.modules["x"]` with a literal name: (x, line)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        target, key = None, None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args:
            target, key = node.func.value, node.args[0]
        elif isinstance(node, ast.Subscript):
            target, key = node.value, node.slice
        if isinstance(target, ast.Attribute) and target.attr == "modules" and isinstance(target.value, ast.Name) \
                and target.value.id == "sys" and isinstance(key, ast.Constant) and isinstance(key.value, str):
            out.append((key.value, node.lineno))
    return out


def test_no_module_finds_another_of_the_package_through_sys_modules():
    """Modules of the package reach each other by import, never by looking a module of the package up in
    `sys.modules` (a handshake that breaks when the module runs as ``__main__``): `cold_start_step` and the
    cold-start child share `gpu.coldstart_step`'s active session instead."""
    bad = [f"{m}:{line} looks up {k}" for m, p in MODULES.items() for k, line in _sys_modules_lookups(p)
           if k == ROOT or k.startswith(ROOT + ".")]
    assert bad == []
    child = _sys_modules_lookups(MODULES[f"{GPU_PACKAGE}.coldstart_child"])
    assert "torch._dynamo.utils" in {k for k, _ in child}   # the reader sees the lookups there are


def _private_members() -> set[str]:
    """The private attributes and methods (one leading underscore) of the package's classes."""
    out = set()
    for p in MODULES.values():
        for cls in (n for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)):
            for n in ast.walk(cls):
                name = n.name if isinstance(n, ast.FunctionDef) else n.attr if isinstance(n, ast.Attribute) and \
                    isinstance(n.value, ast.Name) and n.value.id == "self" else ""
                if name.startswith("_") and not name.startswith("__"):
                    out.add(name)
    return out


def test_the_cold_start_modules_use_each_others_public_names_only():
    """The cold-start modules (runner, child, step marker, analysis, render, command) read no private attribute of
    another object of the package (``session._open``: the child's stages are `Session` methods) and import no
    private name from another module."""
    private = _private_members()
    cold = {m: p for m, p in MODULES.items() if "coldstart" in m}
    bad = []
    for m, p in cold.items():
        for n in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(n, ast.Attribute) and n.attr in private and \
                    not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                bad.append(f"{m}:{n.lineno} reads {ast.unparse(n)}")
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(ROOT):
                bad += [f"{m}:{n.lineno} imports {n.module}.{a.name}" for a in n.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []
    assert len(cold) >= 14 and "_open" in private          # the rule reads the modules and the session's state


def test_the_step_marker_imports_on_any_machine():
    """`cublaslt_probe.cold_start_step` (a program imports it, on a GPU machine or not) is `gpu.coldstart_step`,
    whose imports, followed through the package (in functions too), reach no module that imports torch, cupy or
    ctypes; `import cublaslt_probe` does not import it until it is asked for."""
    start = f"{GPU_PACKAGE}.coldstart_step"
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += [t for t, _, _ in IMPORTS[m] if t in MODULES]
    bad = [f"{m}:{line} imports {t}" for m in sorted(seen) for t, line, _ in IMPORTS[m]
           if t.split(".")[0] in GPU_LIBRARIES]
    assert bad == [] and start in seen
    import subprocess
    import sys
    code = ("import sys, cublaslt_probe\nbefore = 'cublaslt_probe.gpu.coldstart_step' in sys.modules\n"
            "with cublaslt_probe.cold_start_step():\n    pass\n"
            "print(before, cublaslt_probe.cold_start_step.__module__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PACKAGE.parent, check=True)
    assert done.stdout.split() == ["False", start]


# The GPU module that reads CUDA events: `gpu/timing.py`, home of every timing loop (the proof's step loop too,
# `timing.step_block_us`, which the live prover and its fresh-process child share: docs/prove.md).
EVENT_TIMERS = {f"{GPU_PACKAGE}.timing"}


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
    for prover in ("prove", "prove_child"):      # the live prover and its fresh-process child time through it
        assert f"{GPU_PACKAGE}.timing" in {t for t, _, _ in IMPORTS[f"{GPU_PACKAGE}.{prover}"]}, prover


def test_what_audit_measure_measures_is_planned_on_the_cpu():
    """The plan of `audit --measure` (cases, what-ifs, the experts problem) and the typed measurement import no
    GPU code at all, not even in a function, and gpu.measure takes its plan from there."""
    for m in ("analysis.audit.plan", "analysis.audit.measurement"):
        targets = {t for t, _, _ in IMPORTS[f"{ROOT}.{m}"]}
        assert not any(t == GPU_PACKAGE or t.startswith(GPU_PACKAGE + ".") or t.split(".")[0] in GPU_LIBRARIES
                       for t in targets), (m, targets)
    assert f"{ROOT}.analysis.audit.plan" in {t for t, _, top in IMPORTS[f"{GPU_PACKAGE}.measure"] if top}
