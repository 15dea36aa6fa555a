"""The layout of a capture run folder: what `capture()` writes and what `audit` reads.

A run folder holds one profiled stretch of a user's program (one or more steps):

- ``trace.json.gz``: the torch.profiler Chrome trace (``record_shapes=True``), gzip.
- ``cublaslt.log``: the cuBLASLt level-2 log of the same process over the same stretch, in the library's own
  line format (one ``[Trace]`` line per cuBLASLt matmul, with its algo).
- ``group_sizes.jsonl``: the group sizes of every grouped GEMM call (``aten::_grouped_mm``,
  ``aten::_scaled_grouped_mm``) the stretch made, one JSON record a call (`recorder.GroupSizes`), keyed by step,
  the call's place among the step's grouped calls, the op and its operands' dims.
- ``compiled_gemms.jsonl``: each GEMM node of every graph `torch.compile` (Inductor) compiled while the capture
  was open, in the graph's order, with its problem and the module it came from (`recorder.CompiledGemms`):
  inside compiled code no module range runs, so `graphs.compiled_module_ranges` gives its GEMM ops theirs.
- ``env.json``: the environment (GPU, SM count, driver, CUDA, cuBLAS, torch) and the capture's own facts
  (``steps``, the module names recorded, the options used).

Module attribution: around each module's forward the capture opens a profiler range named
``MODULE_PREFIX + qualified_name`` (``cublaslt_probe.module:model.layers.3.mlp.down_proj``), and around each
step a range named ``STEP_PREFIX + str(index)``. Both appear in the trace as ``user_annotation`` events on the
thread that ran the forward. Backward kernels are attributed through the autograd ``Sequence number`` that
torch.profiler records on a forward op and on the backward node that differentiates it.

This module holds the names, and the readers of the jsonl files whose records `audit` reads line by line
(`read_records`, `read_group_sizes`; `graphs.read_compiled_gemms`): a bad line is skipped and named (file:line),
never the whole file refused. It imports nothing from torch and is read on a CPU machine.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

TRACE_FILE = "trace.json.gz"
LOG_FILE = "cublaslt.log"
ENV_FILE = "env.json"
GROUP_SIZES_FILE = "group_sizes.jsonl"

COMPILED_GEMMS_FILE = "compiled_gemms.jsonl"   # each GEMM node of the graphs Inductor compiled, with its module
GRAPHS_DIR = "graphs"   # graph_N.dot: the nodes of each CUDA graph captured while the capture was open

MODULE_PREFIX = "cublaslt_probe.module:"
GRAPH_CAPTURE_PREFIX = "cublaslt_probe.graph_capture:"   # around a CUDA graph's capture (launches recorded)
GRAPH_REPLAY_PREFIX = "cublaslt_probe.graph_replay:"     # around a replay of graph N
STEP_PREFIX = "cublaslt_probe.step:"


LINE_KEY = "_line"    # the line of its file a record read by `read_records` came from (1-based)


def read_records(path: str | os.PathLike, check, what: str, notes: list[str] | None = None) -> list[dict]:
    """The records of a jsonl file of a run folder, each a JSON object that `check` accepts (`check(record)`
    returns None, or why the record is not usable), in file order, each with its line under `LINE_KEY`.

    A byte order mark, an empty line and undecodable bytes cost nothing; a line that is not a usable record is
    skipped, and `notes` gets one line naming the file, the lines skipped and why (the first's reason), so one
    bad line costs only itself."""
    path = Path(path)
    out, bad = [], []
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                bad.append((i, "not JSON"))
                continue
            why = check(r) if isinstance(r, dict) else f"a JSON {type(r).__name__}, not an object"
            if why:
                bad.append((i, why))
                continue
            r[LINE_KEY] = i
            out.append(r)
    if bad and notes is not None:
        notes.append(f"{where(path, [i for i, _ in bad])}: {len(bad):,} line(s) skipped, not {what} "
                     f"(line {bad[0][0]}: {bad[0][1]}); the other {len(out):,} read")
    return out


def where(path: str | os.PathLike, lines: list[int], most: int = 5) -> str:
    """``file:3,7,12,…`` naming the lines `lines` of `path` (the first `most`, then how many more)."""
    lines = sorted(set(lines))
    more = f",… ({len(lines) - most:,} more)" if len(lines) > most else ""
    return f"{path}:{','.join(map(str, lines[:most]))}{more}"


def _sizes_problem(r: dict) -> str | None:
    """Why a group sizes record is not usable (None: usable): an op, a call and sizes, each size an integer
    >= 0."""
    if "op" not in r or "call" not in r:
        return "no op or call"
    sizes = r.get("sizes")
    if not isinstance(sizes, list) or not sizes:
        return "no sizes list"
    odd = [s for s in sizes if type(s) is not int or s < 0]
    if odd:
        return f"a group size is not an integer >= 0 ({json.dumps(odd[0])[:20]})"
    return None


def read_group_sizes(run_dir: str | os.PathLike, notes: list[str] | None = None) -> list[dict] | None:
    """The group sizes records of a run folder (`gpu.recorder.GroupSizes` writes them), in call order, each
    with its line (`LINE_KEY`); None when the folder has no ``group_sizes.jsonl`` (a capture made without
    recording them: the sizes are unknown). A line that is not a record, or whose sizes are not integers >= 0,
    is skipped and named on `notes` (`read_records`)."""
    path = Path(run_dir) / GROUP_SIZES_FILE
    if not path.exists():
        return None
    return read_records(path, _sizes_problem, "a group sizes record", notes)
