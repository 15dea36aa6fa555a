"""TunableOp results rows that pin the audit's "pin" advice on torch >= 2.14. CPU only, pure.

From torch 2.14 TunableOp on CUDA times cuBLASLt heuristic candidates (pytorch/pytorch#186270) and reads its
results from a CSV file: ``Validator,KEY,VALUE`` lines, then ``op,params,solution[,avg_ms]`` rows. A cuBLASLt
solution is named by its whole algo config (``Gemm_Cublaslt_id_66_tile_486_...``), and a loaded row whose
solution is not among the reader's own heuristic candidates is still built from that name, so a row pins the
exact candidate the audit measured. `plan` turns pin items into those lines; `write` writes them.
What each field is, where it was read in torch's source and what is assumed: docs/tunableop.md.

A row is written only where the item's own cuBLASLt log line (`replay`) gives every field torch keys on
(transposes, m, n, k, the leading dimensions as torch passed them, batch) and the measurement gives the config's
enum numbers (tile, stages, cluster, inner shape, reduction scheme as ``cublasLtMatmulAlgoConfigGetAttribute``
returns them); every other pin item is listed with the reason, never guessed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from cublaslt_probe.errors import ProbeError

MIN_TORCH = (2, 14)        # the first torch whose TunableOp times cuBLASLt candidates on CUDA

# Gemm_Cublaslt_id_%d_tile_%u_stages_%u_splitk_%d_red_%u_swizzle_%u_custom_%u_inner_%hu_cluster_%hu:
# CublasltAlgoConfigName in aten/src/ATen/cuda/tunable/GemmCublaslt.h (the _inner_/_cluster_ tail is
# compiled in when CUBLAS_VERSION >= 12000, true of every cuBLAS that has cluster shapes).
SOLUTION = ("Gemm_Cublaslt_id_{id}_tile_{tile}_stages_{stages}_splitk_{splitk}_red_{red}_swizzle_{swizzle}"
            "_custom_{custom}_inner_{inner}_cluster_{cluster}")

# TypeName<T> in TunableGemm.h: float is "tf32" while torch allows TF32 in cuBLAS (the log's compute type says).
_TYPE_NAME = {("R_16BF", None): "BFloat16", ("R_16F", None): "Half", ("R_32F", False): "float",
              ("R_32F", True): "tf32", ("R_64F", None): "double"}
_BIAS_EPILOGUES = {"EPILOGUE_BIAS", "EPILOGUE_RELU_BIAS", "EPILOGUE_GELU_BIAS"}

# The config fields whose value in the row is the enum number cuBLASLt returns, and the measurement's key for it.
_ENUMS = {"tile": "tile_enum", "stages": "stages_enum", "cluster": "cluster_enum", "inner": "inner_shape_enum",
          "red": "reduction_scheme_enum"}


@dataclass
class TunableOpFile:
    """What `plan` makes of a run's pin items: the file's lines (validators first), the items written (their
    ``what``) and those it cannot express, each with the reason."""
    lines: list[str]
    written: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    torch_version: str | None = None      # the run's torch, as the measurement's env gives it

    @property
    def rows(self) -> list[str]:
        return [x for x in self.lines if not x.startswith("Validator,")]


class _NoRow(Exception):
    """Why one pin item has no row (its message is the reason shown to the user)."""


def _release(version: str | None) -> tuple[int, ...] | None:
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(version or ""))
    return None if m is None else tuple(int(x or 0) for x in m.groups())


def reads_rows(torch_version: str | None) -> bool:
    """Whether this torch's TunableOp reads cuBLASLt rows (torch >= 2.14)."""
    rel = _release(torch_version)
    return rel is not None and rel[:2] >= MIN_TORCH


def validators(env: dict, torch_version: str | None = None) -> list[str]:
    """The ``Validator`` lines a CUDA torch >= 2.14 requires, all three or the file is rejected: PT_VERSION
    (torch's TORCH_VERSION, MAJOR.MINOR.PATCH: `torch_version`, else the run's torch when it reads rows, else
    the first that does), CUBLASLT_VERSION (``cublasLtGetVersion()`` as a number: 13.1.0 -> 130100) and
    CUDA_DEVICE (``major.minor:name`` of the device). Raises ProbeError when the env lacks a value."""
    from cublaslt_probe.known_issues import version_tuple
    rel = _release(torch_version) or _release(env.get("torch_version"))
    if torch_version is None and not reads_rows(env.get("torch_version")):
        rel = MIN_TORCH + (0,)
    missing = [k for k in ("cublaslt_version", "cc", "gpu") if not env.get(k)]
    if missing:
        raise ProbeError(f"the measurement's env has no {', '.join(missing)}: TunableOp's validators need them; "
                         "measure again with audit --measure --save")
    try:
        v = version_tuple(env["cublaslt_version"]) + (0, 0)
    except ValueError as e:
        raise ProbeError(f"the measurement's cublaslt_version: {e}") from e
    return [f"Validator,PT_VERSION,{rel[0]}.{rel[1]}.{rel[2] if len(rel) > 2 else 0}",
            f"Validator,CUBLASLT_VERSION,{v[0] * 10000 + v[1] * 100 + v[2]}",
            f"Validator,CUDA_DEVICE,{env['cc']}:{env['gpu']}"]


def _candidate(item: dict, gemms) -> dict | None:
    """The measured candidate the item pins: same GEMM key and pass, same config (`advice.PIN_KEYS`)."""
    from cublaslt_probe.analysis.audit.advice import PIN_KEYS
    ch = item.get("change") if isinstance(item.get("change"), dict) else {}
    algo = ch.get("algo") if isinstance(ch.get("algo"), dict) else {}
    for g in gemms or ():
        if not isinstance(g, dict) or g.get("key") != ch.get("key") or g.get("pass") != ch.get("pass"):
            continue
        for c in g.get("candidates") or []:
            if isinstance(c, dict) and all(c.get(k) == algo.get(k) for k in PIN_KEYS):
                return c
    return None


def solution(algo: dict) -> str:
    """The solution name of one algo config; `algo` holds ``algo_id``, ``split_k``, ``custom_option``,
    ``cta_swizzling`` and the enum numbers (``tile_enum`` ...). Raises _NoRow naming a missing number."""
    miss = [k for k in ("algo_id", *_ENUMS.values()) if algo.get(k) is None]
    if miss:
        raise _NoRow(f"the measured candidate has no {', '.join(miss)} (the config's enum numbers)")
    try:
        return SOLUTION.format(id=int(algo["algo_id"]), splitk=int(algo.get("split_k") or 1),
                               swizzle=int(algo.get("cta_swizzling") or 0),
                               custom=int(algo.get("custom_option") or 0),
                               **{k: int(algo[v]) for k, v in _ENUMS.items()})
    except (TypeError, ValueError) as e:
        raise _NoRow(f"the measured candidate's config is not all numbers ({e})") from e


def op_and_params(line: str | None) -> tuple[str, str]:
    """TunableOp's op and params signatures of the GEMM one cuBLASLt trace line logged. The op is
    ``GemmTunableOp_<type>_<TA><TB>`` (``GemmAndBiasTunableOp_`` with a bias epilogue,
    ``GemmStridedBatchedTunableOp_`` batched); the params ``<ta><tb>_<m>_<n>_<k>_ld_<lda>_<ldb>_<ldc>`` (batched:
    ``..._<k>_B_<batch>_ld_...``), all in cuBLAS's column-major terms. Raises _NoRow with the reason."""
    from cublaslt_probe.logs.parser import parse_line
    if not line:
        raise _NoRow("no logged cuBLASLt line: the leading dimensions TunableOp keys on are unknown")
    r = parse_line(line)
    if r is None or r.kind != "trace" or None in (r.m, r.n, r.k, r.lda, r.ldb, r.ldc, r.a_type):
        raise _NoRow("its logged line is not a cuBLASLt matmul trace with shapes and leading dimensions")
    if r.c_type != r.a_type or r.b_type != r.a_type or r.scale_type not in (None, "R_32F", "R_64F"):
        raise _NoRow(f"types {r.a_type}/{r.b_type} -> {r.c_type}: not one of TunableOp's same-type GEMM ops "
                     "(fp8 and mixed-output GEMMs key on more than the line gives)")
    tf32 = r.compute_type == "COMPUTE_32F_FAST_TF32" if r.a_type == "R_32F" else None
    type_name = _TYPE_NAME.get((r.a_type, tf32))
    if type_name is None:
        raise _NoRow(f"type {r.a_type}: no TunableOp GEMM op for it")
    if min(r.m, r.n, r.k) <= 1:
        raise _NoRow(f"a dimension of 1 ({r.m}×{r.n}×{r.k}): cuBLAS adjusts the leading dimensions then, so "
                     "the ones torch passed (which the params key on) are not in the log")
    ta, tb = (r.op_a or "N"), (r.op_b or "N")
    if "C" in (ta, tb):
        raise _NoRow("a conjugate-transposed operand: TunableOp's GEMM ops are N or T")
    batch = r.batch_count or 1
    if r.epilogue and r.epilogue not in ("EPILOGUE_DEFAULT",) + tuple(_BIAS_EPILOGUES):
        raise _NoRow(f"epilogue {r.epilogue}: no TunableOp GEMM op carries it")
    if batch > 1:
        if r.epilogue in _BIAS_EPILOGUES:
            raise _NoRow("a batched GEMM with a bias epilogue: no TunableOp GEMM op carries it")
        op, dims = "GemmStridedBatchedTunableOp", f"{r.m}_{r.n}_{r.k}_B_{batch}"
    else:
        op = "GemmAndBiasTunableOp" if r.epilogue in _BIAS_EPILOGUES else "GemmTunableOp"
        dims = f"{r.m}_{r.n}_{r.k}"
    return (f"{op}_{type_name}_{ta}{tb}",
            f"{ta.lower()}{tb.lower()}_{dims}_ld_{r.lda}_{r.ldb}_{r.ldc}")


def _row(item: dict, gemms) -> tuple[str, str, str, float | None]:
    ch = item.get("change") if isinstance(item.get("change"), dict) else {}
    algo = dict(ch.get("algo")) if isinstance(ch.get("algo"), dict) else {}
    time_us = None
    if any(algo.get(v) is None for v in _ENUMS.values()):
        c = _candidate(item, gemms)
        if c is None:
            raise _NoRow("its candidate is not in the measurement (the enum numbers of its tile, stages and "
                         "cluster come from there): give the measurement it was advised from")
        algo.update({k: c.get(k) for k in ("algo_id", "split_k", "custom_option", "cta_swizzling",
                                           *_ENUMS.values())})
        time_us = c.get("time_us") if isinstance(c.get("time_us"), (int, float)) else None
    op, params = op_and_params(item.get("replay"))
    return op, params, solution(algo), time_us


def plan(items: list[dict], env: dict, gemms=(), torch_version: str | None = None) -> TunableOpFile:
    """The TunableOp file that pins every pin item it can express: the validators (`validators`), then one
    ``op,params,solution,avg_ms`` row per item (avg_ms: the candidate's measured time), in the items' order.
    `gemms` is the measurement's list (where each candidate's enum numbers are); an item whose op and params
    an earlier row already pins is skipped (TunableOp keeps one solution per op and params)."""
    out = TunableOpFile(validators(env, torch_version), torch_version=env.get("torch_version"))
    seen: dict[tuple[str, str], str] = {}
    for it in items:
        if it.get("kind") != "pin":
            continue
        what = str(it.get("what"))
        try:
            op, params, sol, t = _row(it, gemms)
        except _NoRow as e:
            out.skipped.append((what, str(e)))
            continue
        if (op, params) in seen:
            out.skipped.append((what, f"its op and params are pinned already, by: {seen[op, params]}"))
            continue
        seen[op, params] = what
        out.lines.append(f"{op},{params},{sol}" + ("" if t is None else f",{t / 1000:.6g}"))
        out.written.append(what)
    return out


def rows(items: list[dict], env: dict, gemms=(), torch_version: str | None = None) -> list[str]:
    """The file's lines (validators, then rows); see `plan`."""
    return plan(items, env, gemms, torch_version).lines


def write(path: str, items: list[dict], env: dict, gemms=(), torch_version: str | None = None) -> TunableOpFile:
    """Write `plan`'s lines to `path` (a file torch >= 2.14 reads: docs/tunableop.md) and return the plan."""
    p = plan(items, env, gemms, torch_version)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(x + "\n" for x in p.lines))
    except OSError as e:
        raise ProbeError(f"cannot write TunableOp rows to {path}: {e.strerror or e}") from e
    return p
