"""`audit --measure` on the GPU: for each GEMM of a program, what the alternatives would have cost.

For one GEMM (torch view: op, dtype, layout, m, n, k, batch, and the library path it took), measured with the
probe (`Probe.run_window`, the same timing and kernel capture as a sweep; `probe.lt_candidates` for the
heuristic's candidates):

- ``original``: the GEMM on the path it took in the program;
- ``paths``: the other ways torch could run it: the cuBLAS path (``torch``, 32 MiB workspace), torch's
  cuBLASLt path (``torch-lt``, 1 MiB) and cuBLASLt with 32 MiB (``lt``);
- ``candidates``: up to `top` algos cuBLASLt's heuristic returns (32 MiB), each timed, with its numerics
  against candidate 0 (the candidates' tolerance rules: `candidates.tolerance`);
- ``whatifs``: m, n and k padded up to multiples of 8, 16, 64 and 128 where that changes the value, each timed
  on the original path — the padded GEMM does more work, so a what-if that is faster than the original is a
  cliff (alignment or tile quantization), not noise;
- ``numerics``: max relative difference of each path and each padded GEMM (sliced back) against the original's
  output on the same inputs.

GEMMs the probe cannot rebuild (grouped GEMMs, Triton templates, ops it does not know) are listed with the
reason, not dropped. Imports torch only inside functions (GPU side).
"""
from __future__ import annotations

import logging
import math
import time

from cublaslt_probe.cases import Case, invalid_reason
from cublaslt_probe.errors import CaptureError

log = logging.getLogger(__name__)

PAD_MULTIPLES = (8, 16, 64, 128)
PATHS = ("torch", "torch-lt", "lt")   # cuBLAS 32 MiB, torch's cuBLASLt 1 MiB, cuBLASLt 32 MiB
TORCH_OPS = {"aten::mm": "mm", "aten::matmul": "mm", "aten::addmm": "addmm", "aten::_addmm_activation": "addmm",
             "aten::linear": "addmm", "aten::bmm": "bmm", "aten::baddbmm": "bmm", "aten::_scaled_mm": "scaled_mm"}
_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "tf32": "tf32", "fp8": "fp8", "fp8_e4m3": "fp8",
           "fp8_e5m2": "fp8_e5m2"}


def case_of(g: dict, *, allow_tf32: bool = False) -> tuple[Case | None, str | None]:
    """The probe Case of one audited GEMM (a dict with op, dtype, layout, m, n, k, batch and, optionally,
    ``backend`` — ``torch`` for the cuBLAS path, ``torch-lt`` for the cuBLASLt one — or the joined log line's
    ``log_function``), or why there is none."""
    op = TORCH_OPS.get(g.get("op") or "")
    if op is None:
        return None, f"op {g.get('op')!r} is not one the probe rebuilds (mm, addmm, bmm, _scaled_mm)"
    if g.get("groups"):
        return None, "a grouped GEMM: the probe times single GEMMs"
    dtype = _DTYPES.get(g.get("dtype") or "")
    if dtype is None:
        return None, f"dtype {g.get('dtype')!r} is not one the probe runs"
    if dtype == "fp32" and allow_tf32:
        dtype = "tf32"
    if None in (g.get("m"), g.get("n"), g.get("k")) or not g.get("layout"):
        return None, "the trace gives no shapes or strides for it (record_shapes=True rebuilds them)"
    batch = int(g.get("batch") or 1)
    if op == "mm" and batch > 1:
        op = "bmm"
    backend = g.get("backend")
    if backend not in ("torch", "torch-lt"):
        # the joined log line says which path ran; without a log line, torch's default (cuBLAS)
        backend = path_of(g.get("log_function")) or "torch"
    c = Case(backend, op, dtype, g["layout"], int(g["m"]), int(g["n"]), int(g["k"]), batch)
    why = invalid_reason(c)
    return (None, why) if why else (c, None)


def path_of(log_function) -> str | None:
    """The torch path a logged GEMM took: ``torch-lt`` for cublasLtMatmul (torch's cuBLASLt path), ``torch``
    for a typed wrapper (cublasLtTSTMatmul, ...: its cuBLAS path); None without a logged function."""
    if not isinstance(log_function, str) or not log_function:
        return None
    return "torch-lt" if log_function == "cublasLtMatmul" else "torch"


def pad_values(v: int) -> list[tuple[int, int]]:
    """(multiple, padded value) for each multiple in PAD_MULTIPLES that changes `v`; one entry per value."""
    out, seen = [], set()
    for mult in PAD_MULTIPLES:
        p = int(math.ceil(v / mult) * mult)
        if p != v and p not in seen:
            seen.add(p)
            out.append((mult, p))
    return out


def whatif_cases(c: Case) -> list[tuple[str, int, Case]]:
    """(dimension, multiple, Case) for every padded variant of `c` (on its own path)."""
    out = []
    for dim in ("m", "n", "k"):
        for mult, p in pad_values(getattr(c, dim)):
            kw = {**c.as_dict(), dim: p}
            alt = Case(**kw)
            if invalid_reason(alt) is None:
                out.append((dim, mult, alt))
    return out


def _row(rec: dict) -> dict:
    from cublaslt_probe.evidence import main_kernel
    return {"kernel": main_kernel(rec.get("kernels")), "kernels": rec.get("kernels") or [],
            "time_us": rec.get("time_us"), "error": rec.get("error"),
            "log_line": (rec.get("log_lines") or [None])[0]}


def _numerics(probe, c: Case, alts: list[tuple[str, Case]]) -> dict:
    """Max |y - y0| / max |y0| of each alternative against the original, on the same inputs (torch paths;
    a padded GEMM gets zero padding and is sliced back)."""
    torch = probe.torch
    dt = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
          "fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[c.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def operands(cc: Case):
        A = torch.randn(cc.batch, cc.m, cc.k, device="cuda", generator=gen).mul_(0.5)
        B = torch.randn(cc.batch, cc.k, cc.n, device="cuda", generator=gen).mul_(0.5)
        return A, B

    A0, B0 = operands(c)

    def run(cc: Case, path: str):
        probe.builder.set_flags(Case(**{**cc.as_dict(), "backend": path}))
        A = torch.zeros(cc.batch, cc.m, cc.k, device="cuda")
        B = torch.zeros(cc.batch, cc.k, cc.n, device="cuda")
        A[:, :c.m, :c.k] = A0
        B[:, :c.k, :c.n] = B0
        a, b = A.to(dt), B.to(dt)
        if cc.layout[0] == "T":
            a = a.transpose(-1, -2).contiguous().transpose(-1, -2)
        if cc.layout[1] == "T":
            b = b.transpose(-1, -2).contiguous().transpose(-1, -2)
        if cc.op == "scaled_mm":
            one = torch.ones((), device="cuda")
            y = torch._scaled_mm(a[0], b[0], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)[None]
        elif cc.op == "addmm":
            y = torch.addmm(torch.zeros(cc.n, device="cuda", dtype=dt), a[0], b[0])[None]
        elif cc.batch > 1:
            y = torch.bmm(a, b)
        else:
            y = torch.mm(a[0], b[0])[None]
        return y[:, :c.m, :c.n].float()

    out = {}
    try:
        y0 = run(c, c.backend)
        scale = y0.abs().max().clamp_min(1e-30)
        for label, alt in alts:
            if alt.backend == "lt":
                continue  # the raw cuBLASLt call has its own operands: its numerics are the candidates'
            try:
                y = run(alt, alt.backend)
                out[label] = float(((y - y0).abs().max() / scale).item())
            except Exception as e:  # noqa: BLE001
                out[label] = None
                log.info("numerics of %s failed: %s", label, e)
    finally:
        probe.builder.set_flags(c)
    return out


def measure_gemms(gemms: list[dict], *, top: int = 8, reps: int = 10, allow_tf32: bool = False,
                  probe=None, whatifs: bool = True) -> dict:
    """Measure the alternatives of each GEMM in `gemms` (dicts as `case_of` takes them, with any extra keys —
    `module`, `calls`, `kernel` — carried into the result). Returns {"env", "gemms": [...], "seconds"}."""
    from cublaslt_probe import candidates as cand
    from cublaslt_probe.probe import Probe, lt_candidates
    t_all = time.perf_counter()
    probe = probe or Probe(reps=reps, pipeline=False)  # GEMMs timed one at a time, no windows
    results = []
    for g in gemms:
        t0 = time.perf_counter()
        entry = {"key": {k: g.get(k) for k in ("op", "dtype", "layout", "m", "n", "k", "batch", "groups")},
                 **{k: g[k] for k in ("module", "pass", "calls", "kernel", "gpu_us", "backend", "log_function") if k in g}}
        c, why = case_of(g, allow_tf32=allow_tf32)
        if c is None:
            entry["skipped"] = why
            results.append(entry)
            continue
        entry["case"] = c.key
        paths = [Case(**{**c.as_dict(), "backend": p}) for p in PATHS if p != c.backend]
        wi = whatif_cases(c) if whatifs else []
        todo = [c] + paths + [alt for _, _, alt in wi]
        try:
            recs = probe.run_window(todo)
        except Exception as e:  # noqa: BLE001  one GEMM that cannot run is reported, the others go on
            entry["error"] = f"{type(e).__name__}: {e}"[:300]
            results.append(entry)
            continue
        entry["original"] = _row(recs[0])
        entry["original_us"] = recs[0].get("time_us")
        entry["paths"] = [{"path": p.backend, "workspace": probe.heuristic_workspace(p), **_row(r)}
                          for p, r in zip(paths, recs[1:1 + len(paths)])]
        entry["whatifs"] = [{"dim": d, "multiple": mult, "value": getattr(alt, d), **_row(r)}
                            for (d, mult, alt), r in zip(wi, recs[1 + len(paths):])]
        try:
            cands = lt_candidates(probe, Case(**{**c.as_dict(), "backend": "lt"}), top=top, reps=reps)
            entry["candidates"] = [{**{k: v for k, v in r.items() if k not in ("kernels", "kernel_us")},
                                    "kernel": _row(r)["kernel"], "ok_numerics": cand.usable(r, c.dtype)}
                                   for r in cands]
            entry["regret"] = cand.regret(cands, c.dtype)
        except Exception as e:  # noqa: BLE001
            entry["candidates_error"] = f"{type(e).__name__}: {e}"[:300]
        labels = [(f"path:{p.backend}", p) for p in paths] + [(f"{d}={getattr(alt, d)}", alt) for d, _, alt in wi]
        entry["numerics"] = _numerics(probe, c, labels)
        entry["tolerance"] = cand.tolerance(c.dtype)
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        results.append(entry)
        log.info("measured %s in %.2f s", c.key, entry["seconds"])
    return {"env": probe.env, "gemms": results, "seconds": round(time.perf_counter() - t_all, 3)}


def require(gemms) -> None:
    if not gemms:
        raise CaptureError("audit --measure: no GEMM to measure (the trace has no GEMM-kind kernel)")
