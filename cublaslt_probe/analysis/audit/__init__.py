"""`audit`: every GEMM of a profiled step, attributed to its layer and judged against its roofline.

CPU only. Input: a capture run folder (`runfiles`: ``trace.json.gz``, ``cublaslt.log``, ``env.json``) or a bare
torch.profiler trace (with an optional cuBLASLt log). `audit(path)` returns an `Audit` whose ``rows`` hold one row
per distinct GEMM (kernel + problem + module + pass; columns `AUDIT_SCHEMA`), with layers collapsed where they
repeat (``model.layers.*.mlp.down_proj`` ×32); `advice(rows, measure)` turns saved GPU measurements into ranked
advice; `cublaslt_probe.render.audit` draws them (text lines, table, HTML). docs/audit.md describes each column and
rule.

The parts, each importing only the ones listed before it:
- `schema`: the row's columns (`AUDIT_SCHEMA`), the jsonl key order, the `Audit` result, row helpers;
- `attribute`: the run's files and env, GPU facts, steps, modules and passes, the cuBLASLt log join;
- `judge`: one row per distinct GEMM, judged against its GPU's roofline;
- `core`: `audit()` itself and its notes on what could not be shown;
- `plan`: what `audit --measure` measures (cases, what-ifs, the experts problem), decided on the CPU;
- `measurement`: the saved measurement as types (`Measurement`, with its ``schema_version``);
- `measured`: a saved measurement read, checked into a `Measurement` and bound to the run audited;
- `advice`: `AdviceItem`s from a `Measurement`, one rule per kind (pin, path, pad, grouped).
This module re-exports the names the CLI, scripts and tests import; what a person reads (text lines, the table,
the chain of evidence, figures, the HTML page) is `cublaslt_probe.render.audit`.
"""
from cublaslt_probe.analysis.audit.advice import (
    ADVICE_KEYS,
    GROUPED_RISK,
    GROUPED_WORDS,
    MIN_GAIN,
    PATH_WORDS,
    AdviceItem,
    advice,
    advice_total,
    pinned_line,
)
from cublaslt_probe.analysis.audit.attribute import (
    CAPTURE_FIELDS,
    CLOCK_SLACK_S,
    ENV_FIELDS,
    EVAL_PREFIX,
    GAP_US,
    SEQ_SPAN,
    TZ_MAX_S,
    TZ_STEP_S,
    GpuFacts,
    _log_dtype,
    collapse,
    gpu_rates,
    resolve,
)
from cublaslt_probe.analysis.audit.core import audit
from cublaslt_probe.analysis.audit.judge import NEAR_FLOOR
from cublaslt_probe.analysis.audit.schema import AUDIT_COLUMNS, AUDIT_SCHEMA, FIXED_KEYS, Audit, jsonl_frame, row_label

__all__ = ["ADVICE_KEYS", "GROUPED_RISK", "GROUPED_WORDS", "MIN_GAIN", "PATH_WORDS", "AdviceItem", "advice",
           "advice_total", "pinned_line", "CAPTURE_FIELDS", "CLOCK_SLACK_S", "ENV_FIELDS", "EVAL_PREFIX", "GAP_US",
           "SEQ_SPAN", "TZ_MAX_S", "TZ_STEP_S", "GpuFacts", "_log_dtype", "collapse", "gpu_rates", "resolve", "audit",
           "NEAR_FLOOR", "AUDIT_COLUMNS", "AUDIT_SCHEMA", "FIXED_KEYS", "Audit", "jsonl_frame", "row_label"]
