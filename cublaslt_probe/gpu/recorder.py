"""Capture a stretch of a user's program into a run folder that `audit` reads (layout: `runfiles`).

    import cublaslt_probe
    with cublaslt_probe.capture("run1/", model=model) as cap:
        for _ in range(2):
            with cap.step():
                step()

records, in one go and in one process:
- a torch.profiler Chrome trace with input shapes (``record_shapes=True``);
- the cuBLASLt level-2 log of the same process (the in-process logger of `lt.Logger`, switched on only while
  the capture is open), in the library's own line format;
- a profiler range around each module's forward, named by its qualified name (``model.layers.3.mlp``), so that
  every kernel can be attributed to a layer; backward kernels are attributed later through the autograd
  sequence numbers the profiler records (see `runfiles`);
- the environment (GPU, driver, CUDA, cuBLAS, torch) and the capture's own facts, in ``env.json``;
- the GEMM nodes of every graph `torch.compile` compiles while it is open, with their modules, in
  ``compiled_gemms.jsonl`` (`CompiledGemms`): compiled code runs no module hook;
- the group sizes of every grouped GEMM the program calls (``torch._grouped_mm``, ``F.grouped_mm`` and the fp8
  forms), in ``group_sizes.jsonl`` (`GroupSizes`): the offsets are a device tensor the trace does not hold.

With ``model=None`` every module that runs is ranged through torch's global module hooks and named by its class
and the order in which it was first seen (``LlamaMLP_0``), as ``with_modules`` traces name them.
A module compiled with ``torch.compile`` is ranged as a whole (pass the compiled module as `model`); inside it no
hook runs, and its GEMMs are named by the modules of their compiled graph's nodes (`CompiledGemms`).

torch is imported inside the functions: importing this module costs nothing on a CPU machine.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from cublaslt_probe import runfiles
from cublaslt_probe.cases import sizes_summary
from cublaslt_probe.errors import CaptureError, error_text

LOG_LEVEL = 2  # one Trace line per cuBLASLt matmul, with its algo
# The Python entry points of torch's grouped GEMMs the recorder wraps (`GroupSizes`): module, attribute, the aten op
# the trace names the call by, and where the offsets sit among the positional arguments (None: keyword only).
GROUPED_ENTRIES = (("torch", "_grouped_mm", "aten::_grouped_mm", 2),
                   ("torch.nn.functional", "grouped_mm", "aten::_grouped_mm", 2),
                   ("torch", "_scaled_grouped_mm", "aten::_scaled_grouped_mm", 4),
                   ("torch.nn.functional", "scaled_grouped_mm", "aten::_scaled_grouped_mm", None))
PINNED_INTS = 1 << 16   # int32 offsets a pinned buffer of the recorder holds (another is added when it is full)


def _group_dim(a: list, b: list) -> str | None:
    """The dimension a grouped GEMM's offsets split, from its operands' dims (torch's convention, as
    `trace.problem_of` reads it): 2-D x 3-D splits m, 3-D x 2-D n, 2-D x 2-D k; 3-D x 3-D is a batch (None)."""
    return {(2, 3): "m", (3, 2): "n", (2, 2): "k"}.get((len(a), len(b)))


def sizes_from_offsets(ends: list[int]) -> list[int]:
    """The rows (or columns) of each group from torch's offsets, the cumulative ends of the groups (pure)."""
    return [e - s for s, e in zip([0] + ends[:-1], ends)]


class GroupSizes:
    """Records the group sizes of each grouped GEMM the program calls while a capture is open, without a host
    synchronisation inside the step. `install()` wraps torch's Python entry points (`GROUPED_ENTRIES`:
    `torch._grouped_mm`, `torch.nn.functional.grouped_mm` and their fp8 forms); a call goes on unchanged, then
    a non-blocking copy of its offsets into pinned host memory is queued on the current stream (the op's);
    `flush()`, after the step has been synchronised, reads them; `uninstall()` puts the entry points back. A
    3-D x 3-D call has no offsets: its groups are its batch. No other op is touched, and the trace holds each
    call once, as without the recorder.

    What it does not see: the calls the autograd engine makes in backward (C++, past the Python entry points;
    they split the same rows as the forward call they differentiate, whose record they can be joined to
    through the trace's autograd sequence numbers), calls made through `torch.ops.aten` directly, and calls
    inside a `torch.compile`d graph (there the wrapper is traced, and its copy breaks the graph).

    Each call becomes one record: `step` (None outside `Capture.step`), `call` (its place among the step's
    recorded grouped calls, 0 first), `op` (the trace's name), the dims of A, B and the offsets as the trace's
    "Input Dims" give them, `group_dim`, `groups`, `sizes` and their summary (`cases.sizes_summary`)."""

    def __init__(self, torch):
        import threading
        self.torch = torch
        self.records: list[dict] = []
        self.step: int | None = None
        self._calls: dict = {}            # step -> grouped calls seen in it
        self._chunks = [torch.empty(PINNED_INTS, dtype=torch.int32, pin_memory=True)]
        self._used = 0                    # ints used in the last chunk
        self._pending: list[tuple] = []   # (record, chunk, start, n) copied, not read yet
        self._saved: list[tuple] = []     # (module, attribute, original) while installed
        self._inside = threading.local()  # a wrapped entry calling another (F.grouped_mm -> torch._grouped_mm)

    def install(self) -> None:
        import importlib
        for mod_name, attr, op, at in GROUPED_ENTRIES:
            mod = importlib.import_module(mod_name)
            orig = getattr(mod, attr, None)
            if orig is None:
                continue
            self._saved.append((mod, attr, orig))
            setattr(mod, attr, self._wrap(orig, op, at))

    def uninstall(self) -> None:
        for mod, attr, orig in reversed(self._saved):
            setattr(mod, attr, orig)
        self._saved.clear()

    def _wrap(self, orig, op: str, at: int | None):
        import functools
        inside = self._inside

        @functools.wraps(orig)
        def grouped(*args, **kwargs):
            if getattr(inside, "on", False):
                return orig(*args, **kwargs)
            inside.on = True
            try:
                out = orig(*args, **kwargs)
            finally:
                inside.on = False
            offs = kwargs.get("offs", args[at] if at is not None and len(args) > at else None)
            self.see(op, args[0], args[1] if len(args) > 1 else kwargs.get("mat_b"), offs)
            return out
        return grouped

    def see(self, op: str, a, b, offs) -> None:
        torch = self.torch
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            return
        da, db = list(a.shape), list(b.shape)
        n = self._calls.get(self.step, 0)
        self._calls[self.step] = n + 1
        rec = {"step": self.step, "call": n, "op": op, "a": da, "b": db,
               "offs": list(offs.shape) if isinstance(offs, torch.Tensor) else None, "group_dim": _group_dim(da, db)}
        self.records.append(rec)
        if not isinstance(offs, torch.Tensor) or offs.dim() != 1:   # 3-D x 3-D: a batch of equal GEMMs
            rec["sizes"] = [da[-2]] * da[0] if len(da) == 3 and len(db) == 3 else []
            self._summarise(rec)
            return
        k = offs.numel()
        if self._used + k > self._chunks[-1].numel():
            self._chunks.append(torch.empty(max(PINNED_INTS, k), dtype=torch.int32, pin_memory=True))
            self._used = 0
        chunk = self._chunks[-1]
        chunk[self._used:self._used + k].copy_(offs, non_blocking=True)
        self._pending.append((rec, chunk, self._used, k))
        self._used += k

    def flush(self) -> None:
        """Read the offsets copied so far (call it once the GPU has finished them: after a synchronisation)."""
        for rec, chunk, start, k in self._pending:
            rec["sizes"] = sizes_from_offsets(chunk[start:start + k].tolist())
            self._summarise(rec)
        self._pending.clear()
        # every chunk read: the last is used again from its start
        self._chunks = self._chunks[-1:]
        self._used = 0

    @staticmethod
    def _summarise(rec: dict) -> dict:
        rec["groups"] = len(rec["sizes"])
        rec["summary"] = sizes_summary(rec["sizes"])
        return rec

    def write(self, path) -> int:
        """The records as JSON lines at `path`; returns how many."""
        with open(path, "w") as f:
            for r in self.records:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        return len(self.records)


class GraphRecorder:
    """Records the CUDA graphs captured while a capture is open, so that `audit` can join the kernels replayed
    later to the launches that built them (`graphs`). `install()` wraps ``torch.cuda.CUDAGraph``'s
    ``capture_begin``, ``capture_end`` and ``replay`` (what ``torch.cuda.graph``, ``make_graphed_callables`` and
    Inductor's cudagraph trees call):

    - capture_begin: debug mode on (the driver's graph is kept for `debug_dump`), and a profiler range
      ``runfiles.GRAPH_CAPTURE_PREFIX + N`` opened: the ops, shapes, module ranges and runtime launch calls the
      profiler records inside it are what the graph holds (no kernel runs during a capture);
    - capture_end: the range closed, the graph's nodes written by ``debug_dump`` to
      ``graphs/graph_N.dot`` (kernel names, launch dimensions, in launch order);
    - replay: a range ``runfiles.GRAPH_REPLAY_PREFIX + N`` around it.

    A graph captured before the capture opened has none of this: its replays are kernels linked only to
    ``cudaGraphLaunch``. `uninstall()` puts the methods back."""

    def __init__(self, torch, run_dir: Path):
        self.torch = torch
        self.run_dir = run_dir
        self.graphs: list[dict] = []
        self._ids: dict[int, int] = {}      # id(graph) -> N of its latest capture
        self._captured = 0
        self._open: dict[int, object] = {}
        self._saved: list[tuple] = []

    def install(self) -> None:
        cls = getattr(self.torch.cuda, "CUDAGraph", None)
        if cls is None:
            return
        for attr, make in (("capture_begin", self._begin), ("capture_end", self._end), ("replay", self._replay)):
            orig = cls.__dict__.get(attr) or getattr(cls, attr, None)
            if orig is None:
                continue
            self._saved.append((cls, attr, cls.__dict__.get(attr)))
            setattr(cls, attr, make(orig))

    def uninstall(self) -> None:
        for cls, attr, orig in reversed(self._saved):
            if orig is None:
                delattr(cls, attr)
            else:
                setattr(cls, attr, orig)
        self._saved.clear()

    def _range(self, name: str):
        rf = self.torch.autograd.profiler.record_function(name)
        rf.__enter__()
        return rf

    def _begin(self, orig):
        import functools
        rec = self

        @functools.wraps(orig)
        def capture_begin(graph, *args, **kwargs):
            n = rec._ids[id(graph)] = rec._captured      # a graph captured again is a new graph
            rec._captured += 1
            try:
                graph.enable_debug_mode()
            except (AttributeError, RuntimeError):
                pass
            rec._open[id(graph)] = rec._range(runfiles.GRAPH_CAPTURE_PREFIX + str(n))
            return orig(graph, *args, **kwargs)
        return capture_begin

    def _end(self, orig):
        import functools
        rec = self

        @functools.wraps(orig)
        def capture_end(graph, *args, **kwargs):
            try:
                return orig(graph, *args, **kwargs)
            finally:
                rf = rec._open.pop(id(graph), None)
                if rf is not None:
                    rf.__exit__(None, None, None)
                rec._dump(graph)
        return capture_end

    def _dump(self, graph) -> None:
        n = self._ids.get(id(graph))
        if n is None:
            return
        rel = f"{runfiles.GRAPHS_DIR}/graph_{n}.dot"
        entry = {"graph": n, "dot": None, "replays": 0}
        try:
            (self.run_dir / runfiles.GRAPHS_DIR).mkdir(parents=True, exist_ok=True)
            graph.debug_dump(str(self.run_dir / rel))
            if (self.run_dir / rel).is_file():
                entry["dot"] = rel
            else:   # torch drops the driver's graph at capture_end unless the graph keeps it (keep_graph=True)
                entry["error"] = "debug_dump wrote no file: the graph was not kept after its capture"
        except (AttributeError, RuntimeError, OSError) as e:
            entry["error"] = error_text(e)
        self.graphs.append(entry)

    def _replay(self, orig):
        import functools
        rec = self

        @functools.wraps(orig)
        def replay(graph, *args, **kwargs):
            n = rec._ids.get(id(graph))
            if n is None:
                return orig(graph, *args, **kwargs)
            for g in rec.graphs:
                if g["graph"] == n:
                    g["replays"] += 1
            with rec.torch.autograd.profiler.record_function(runfiles.GRAPH_REPLAY_PREFIX + str(n)):
                return orig(graph, *args, **kwargs)
        return replay


# the aten GEMM ops of a compiled graph `CompiledGemms` records: op name -> where A and B sit among its arguments
COMPILED_GEMM_NODES = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2), "_scaled_mm": (0, 1)}


class CompiledGemms:
    """Records each GEMM node of every graph Inductor (`torch.compile`) compiles while a capture is open, so
    that `audit` can name the module of GEMMs that compiled code runs (`graphs.compiled_module_ranges`).
    Inside a compiled graph no forward hook runs and Inductor removes profiler ranges, so the trace holds the
    GEMM ops (``aten::mm``, with shapes) under the compiled wrapper's range only; the module each came from is
    in the graph's node metadata (``nn_module_stack``), which this reads.

    `install()` chains a pass after Inductor's post-grad passes (``torch._inductor.config
    .post_grad_custom_post_pass``; a pass already set runs first); the pass reads the graph and changes
    nothing. A set pass makes Inductor bypass its compiled-graph cache, so a graph compiled before is compiled
    again and recorded. Each record: ``graph`` (the graphs seen, 0 first), ``compile_id`` (Dynamo's, as its
    ``Torch-Compiled Region`` ranges name it), ``node`` (the GEMM's place among the graph's GEMMs), ``op`` (the
    trace's name), ``a`` and ``b`` (dims), ``m``, ``n``, ``k``, ``batch``, and ``module`` (the qualified name
    as `graphs.module_path` reads Dynamo's; else the name of the call that made it, ``source_fn``; None
    without either). `uninstall()` puts the previous
    pass back."""

    def __init__(self):
        self.records: list[dict] = []
        self._graphs = 0
        self._config = None
        self._saved = None

    def install(self) -> None:
        try:
            from torch._inductor import config
        except Exception:  # noqa: BLE001  no Inductor in this torch: nothing is compiled by it
            return
        if not hasattr(config, "post_grad_custom_post_pass"):
            return
        self._config, self._saved = config, config.post_grad_custom_post_pass
        before, rec = self._saved, self

        def cublaslt_probe_gemm_modules(graph):
            if before is not None:
                before(graph)
            rec.see(graph)
        config.post_grad_custom_post_pass = cublaslt_probe_gemm_modules

    def uninstall(self) -> None:
        if self._config is not None:
            self._config.post_grad_custom_post_pass = self._saved
            self._config = None

    def see(self, graph) -> None:
        """Record the GEMM nodes of one post-grad FX graph, in its order (never raises: a graph this cannot
        read is skipped, the compilation goes on)."""
        from cublaslt_probe.analysis.graphs import module_path
        try:
            from torch._guards import CompileContext
            cid = CompileContext.current_compile_id()
        except Exception:  # noqa: BLE001  a torch without compile ids
            cid = None
        n, g = 0, self._graphs
        self._graphs += 1
        try:
            for node in graph.nodes:
                if node.op != "call_function":
                    continue
                parts = str(node.target).split(".")
                where = COMPILED_GEMM_NODES.get(parts[1]) if len(parts) >= 2 and parts[0] == "aten" else None
                if where is None or len(node.args) <= where[1]:
                    continue
                dims = [_dims(node.args[i]) for i in where]
                stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
                inner = list(stack.values())[-1] if stack else None
                path = inner[0] if isinstance(inner, tuple) and inner else inner
                cls = inner[1] if isinstance(inner, tuple) and len(inner) > 1 else None
                src = node.meta.get("source_fn_stack") or []
                src = src[-1][0] if src and isinstance(src[-1], tuple) and src[-1] else None
                rec = {"graph": g, "compile_id": None if cid is None else str(cid), "node": n,
                       "op": "aten::" + parts[1], "a": dims[0], "b": dims[1],
                       "module": module_path(path, getattr(cls, "__name__", cls)) or module_path(src),
                       "source_fn": src if isinstance(src, str) else None}
                rec.update(_problem(dims[0], dims[1]))
                self.records.append(rec)
                n += 1
        except Exception:  # noqa: BLE001  the compilation must not fail for the recorder
            return

    def write(self, path) -> int:
        """The records as JSON lines at `path`; returns how many."""
        with open(path, "w") as f:
            for r in self.records:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        return len(self.records)


def _dims(arg) -> list | None:
    """The concrete dims of an FX node's tensor value, None when they are not all integers."""
    val = getattr(arg, "meta", {}).get("val") if hasattr(arg, "meta") else None
    try:
        return [int(x) for x in val.shape]
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None


def _problem(a: list | None, b: list | None) -> dict:
    """m, n, k, batch of A x B in torch's view (as `trace.problem_of` reads recorded dims)."""
    if a and b and len(a) == 2 and len(b) == 2:
        return {"m": a[0], "n": b[1], "k": a[1], "batch": 1}
    if a and b and len(a) == 3 and len(b) == 3:
        return {"m": a[1], "n": b[2], "k": a[2], "batch": a[0]}
    return {"m": None, "n": None, "k": None, "batch": None}


class Capture:
    """An open capture; `step()` marks one step of the program (optional: without it the stretch is one step)."""

    def __init__(self, run_dir: str | os.PathLike, model=None, *, with_modules: bool = False,
                 log: bool = True, label: str | None = None, group_sizes: bool = True,
                 warmup: int | None = None, whole_script: bool = False):
        self.run_dir = Path(run_dir)
        self.warmup = warmup
        self.whole_script = whole_script
        self.group_sizes = group_sizes
        self._sizes: GroupSizes | None = None
        self._graphs: GraphRecorder | None = None
        self._compiled: CompiledGemms | None = None
        self.model = model
        self.with_modules = with_modules
        self.log = log
        self.label = label
        self.steps = 0
        self.step_wall_s: list[float] = []
        self.modules: dict[str, str] = {}
        self._handles: list = []
        self._open: dict[int, list] = {}
        self._seen: dict[int, str] = {}
        self._counts: dict[str, int] = {}
        self._prof = None
        self._logger = None
        self._lib = None
        self._t0 = 0.0

    # --- module ranges -------------------------------------------------------------------------------------
    def _enter(self, name: str):
        rf = self._torch.autograd.profiler.record_function(runfiles.MODULE_PREFIX + name)
        rf.__enter__()
        return rf

    def _pre(self, name):
        def hook(module, args):
            self._open.setdefault(id(module), []).append(self._enter(name))
        return hook

    def _post(self, module, args, output):
        stack = self._open.get(id(module))
        if stack:
            stack.pop().__exit__(None, None, None)

    def _global_name(self, module) -> str:
        key = id(module)
        name = self._seen.get(key)
        if name is None:
            cls = type(module).__name__
            n = self._counts.get(cls, 0)
            self._counts[cls] = n + 1
            name = self._seen[key] = f"{cls}_{n}"
            self.modules[name] = cls
        return name

    def _global_pre(self, module, args):
        self._open.setdefault(id(module), []).append(self._enter(self._global_name(module)))

    def _hook_modules(self) -> None:
        torch = self._torch
        if self.model is None:
            mm = torch.nn.modules.module
            self._handles.append(mm.register_module_forward_pre_hook(self._global_pre))
            self._handles.append(mm.register_module_forward_hook(self._post))
            return
        compiled = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
        compiled_cls = getattr(compiled, "OptimizedModule", ())
        root = type(getattr(self.model, "_orig_mod", self.model)).__name__
        skip: list[str] = []
        for qual, mod in self.model.named_modules():
            if any(qual.startswith(s) for s in skip):
                continue
            name = qual.replace("_orig_mod.", "").replace("._orig_mod", "") or root
            if qual.endswith("_orig_mod"):
                continue
            if isinstance(mod, compiled_cls):  # its inside runs as one graph: range the wrapper only
                skip.append((qual + "." if qual else "") + "_orig_mod")
            self.modules[name] = type(getattr(mod, "_orig_mod", mod)).__name__
            self._handles.append(mod.register_forward_pre_hook(self._pre(name)))
            self._handles.append(mod.register_forward_hook(self._post))

    # --- steps ---------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self):
        """One step of the program: a profiler range, and its wall time (the GPU synchronised at the end)."""
        torch = self._torch
        t0 = time.perf_counter()
        if self._sizes is not None:
            self._sizes.step = self.steps
        try:
            with torch.autograd.profiler.record_function(runfiles.STEP_PREFIX + str(self.steps)):
                yield self.steps
        finally:
            if self._sizes is not None:
                self._sizes.step = None
        torch.cuda.synchronize()
        self.step_wall_s.append(time.perf_counter() - t0)
        if self._sizes is not None:
            self._sizes.flush()   # after the synchronisation: the copies are done
        self.steps += 1

    def _step_finding(self) -> str:
        """How `audit` finds this capture's steps (env.json ``capture.step_finding``): ``marked`` (`step()`),
        ``whole`` (the stretch is one step, asked for), ``found`` (`steps.found_steps`: each optimizer step,
        else each call of the outermost module's forward, the first ``warmup`` left out)."""
        if self.steps:
            return "marked"
        return "whole" if self.whole_script else "found"

    # --- open / close --------------------------------------------------------------------------------------
    def __enter__(self) -> "Capture":
        from cublaslt_probe.gpu import lt
        from cublaslt_probe.gpu.host import require_gpu
        self._torch = torch = require_gpu("capture")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.log:
            lt.ensure_loaded()
            self._lib = lt.LtLibrary()
            self._logger = lt.Logger(self._lib)
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                             with_modules=self.with_modules)
        self._hook_modules()
        if self.group_sizes:
            self._sizes = GroupSizes(torch)
            self._sizes.install()
        self._graphs = GraphRecorder(torch, self.run_dir)
        self._graphs.install()
        self._compiled = CompiledGemms()
        self._compiled.install()
        torch.cuda.synchronize()
        self._prof.__enter__()
        if self._logger is not None:
            self._logger.take()
            self._logger.set_level(LOG_LEVEL)
        self._t0 = time.time()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        torch = self._torch
        try:
            torch.cuda.synchronize()
        finally:
            if self._sizes is not None:
                self._sizes.uninstall()
                self._sizes.flush()
            if self._graphs is not None:
                self._graphs.uninstall()
            if self._compiled is not None:
                self._compiled.uninstall()
            if self._logger is not None:
                self._logger.set_level(0)
            self._prof.__exit__(exc_type, exc, tb)
            for h in self._handles:
                h.remove()
            self._handles.clear()
        if exc_type is not None:
            return
        self._write()

    def _write(self) -> None:
        from cublaslt_probe.gpu.host import environment
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "trace.json")
            self._prof.export_chrome_trace(raw)
            with open(raw, "rb") as src, gzip.open(self.run_dir / runfiles.TRACE_FILE, "wb", 6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        lines = 0
        if self._logger is not None:
            from cublaslt_probe.gpu import lt
            text = lt.Logger.render(self._logger.take())
            lines = len(text)
            (self.run_dir / runfiles.LOG_FILE).write_text("".join(t + "\n" for t in text))
        sizes = None
        if self._sizes is not None:
            sizes = self._sizes.write(self.run_dir / runfiles.GROUP_SIZES_FILE)
        compiled = None
        if self._compiled is not None and self._compiled.records:
            compiled = self._compiled.write(self.run_dir / runfiles.COMPILED_GEMMS_FILE)
        torch = self._torch
        env = environment(self._lib)
        env["capture"] = {
            "label": self.label,
            "steps": max(self.steps, 1),
            "steps_marked": self.steps,
            "step_finding": self._step_finding(),
            "warmup": self.warmup,
            "step_wall_s": [round(s, 6) for s in self.step_wall_s],
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._t0)),
            "log_level": LOG_LEVEL if self._logger is not None else 0,
            "log_lines": lines,
            "group_sizes_calls": sizes,   # grouped GEMM calls recorded (None: not recorded, sizes unknown)
            "module_naming": "qualified" if self.model is not None else "class_order",
            "modules": self.modules,
            "cuda_graphs": self._graphs.graphs if self._graphs is not None else None,
            "compiled_gemm_nodes": compiled,   # GEMM nodes of graphs Inductor compiled (None: none compiled)
            "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "preferred_blas_library": str(torch.backends.cuda.preferred_blas_library()).split(".")[-1],
        }
        (self.run_dir / runfiles.ENV_FILE).write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")


def capture(run_dir: str | os.PathLike, model=None, *, with_modules: bool = False, log: bool = True,
            label: str | None = None, group_sizes: bool = True, warmup: int | None = None,
            whole_script: bool = False) -> Capture:
    """A context manager that records the program run inside it into `run_dir` (see the module doc);
    `group_sizes=False` records no group sizes and leaves torch's grouped GEMM entry points as they are
    (`GroupSizes`). Without `step()` marks, `audit` finds the steps from the optimizer steps or the outermost
    module calls and leaves out the first `warmup` (None: audit's default); `whole_script=True` makes the
    whole stretch one step instead."""
    if model is not None and not hasattr(model, "named_modules"):
        raise CaptureError(f"capture: model={type(model).__name__} is not a torch.nn.Module; pass the module "
                           "whose layers should name the kernels, or model=None")
    if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0):
        raise CaptureError(f"capture: warmup={warmup!r}: give a count of steps, 0 or more")
    return Capture(run_dir, model, with_modules=with_modules, log=log, label=label, group_sizes=group_sizes,
                   warmup=warmup, whole_script=whole_script)


def run_script(run_dir: str | os.PathLike, argv: list[str], *, label: str | None = None, warmup: int = 1,
               whole_script: bool = False) -> None:
    """Run a Python script (``argv[0]``, with ``argv[1:]`` as its arguments) inside one capture, its modules
    named by class (no model is known). The script is not edited: its steps are each optimizer step, else each
    call of its outermost module's forward, the first `warmup` left out as warm-up (model loading, weight
    copies and first calls fall outside them: `steps.found_steps`, applied by `audit`); `whole_script=True`
    makes the whole run one step."""
    import runpy
    import sys
    if not argv:
        raise CaptureError("capture: no script given; use `cublaslt-probe capture -o RUN -- SCRIPT.py [ARGS]`")
    script = argv[0]
    if not os.path.isfile(script):
        raise CaptureError(f"capture: {script}: no such file; give the path of a Python script")
    old = sys.argv
    sys.argv = list(argv)
    try:
        with capture(run_dir, None, label=label or os.path.basename(script), warmup=warmup,
                     whole_script=whole_script):
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = old
