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

This module holds the names, and the reader of the one file whose records `audit` reads line by line
(`read_group_sizes`): it imports nothing from torch and is read on a CPU machine.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from cublaslt_probe.errors import CaptureError

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


def read_group_sizes(run_dir: str | os.PathLike) -> list[dict] | None:
    """The group sizes records of a run folder (`gpu.recorder.GroupSizes` writes them), in call order; None when the folder has no
    ``group_sizes.jsonl`` (a capture made without recording them: the sizes are unknown). A line that is not
    a record raises CaptureError naming the file and line."""
    path = Path(run_dir) / GROUP_SIZES_FILE
    if not path.exists():
        return None
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                ok = isinstance(r, dict) and isinstance(r.get("sizes"), list) and "op" in r and "call" in r
            except ValueError:
                ok = False
            if not ok:
                raise CaptureError(f"{path}:{i}: not a group sizes record; capture the run again "
                                   "(cublaslt_probe.capture records them)")
            out.append(r)
    return out
