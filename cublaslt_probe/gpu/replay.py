"""Replay a logged GEMM: rebuild it from its cuBLASLt trace line, pin the logged algo, run it, and report the
kernel it launches, its time, and what the heuristic picks today for the same problem.

GPU side: `replay(records)`. CPU side: `problem_from_record(rec)` (what can be rebuilt, or why not) and
`render(results)`.
"""
from __future__ import annotations

from cublaslt_probe.dtypes import log_dtype, log_type, lt_types, output_type, short_dtype
from cublaslt_probe.errors import error_text

# The (A type, B type, compute type) combinations, as the log writes them, that the lt backend rebuilds
_REPLAYABLE = (("R_32F", "R_32F", "COMPUTE_32F"), ("R_32F", "R_32F", "COMPUTE_32F_FAST_TF32"),
           ("R_16F", "R_16F", "COMPUTE_32F"), ("R_16BF", "R_16BF", "COMPUTE_32F"),
           ("R_8F_E4M3", "R_8F_E4M3", "COMPUTE_32F"), ("R_8F_E5M2", "R_8F_E4M3", "COMPUTE_32F"),
           ("R_8F_E4M3", "R_8F_E5M2", "COMPUTE_32F"))


class NotReplayable(Exception):
    """A logged line that cannot be rebuilt; the message says why."""


def problem_from_record(rec) -> dict:
    """What `replay` will build for a trace LogRecord: dtype, m, n, k, transposes, lds, batch, bias, algo
    config. Raises NotReplayable naming the missing or unsupported field."""
    if rec.kind != "trace":
        raise NotReplayable(f"line {rec.line} is a {rec.kind} line, not a matmul trace")
    missing = [f for f in ("a_type", "b_type", "c_type", "compute_type", "m", "n", "k", "algo_id")
               if getattr(rec, f) is None]
    if missing:
        raise NotReplayable(f"line {rec.line}: the log line lacks {', '.join(missing)} (truncated or older format)")
    key = (rec.a_type, rec.b_type, rec.compute_type)
    if key not in _REPLAYABLE:
        raise NotReplayable(f"line {rec.line}: types A={rec.a_type} B={rec.b_type} compute={rec.compute_type} are not "
                            f"among the replayable combinations ({', '.join('/'.join(k) for k in _REPLAYABLE)})")
    dt = log_dtype(*key)
    out = log_type(output_type(dt))
    if rec.c_type != out or (rec.d_type and rec.d_type != rec.c_type):
        raise NotReplayable(f"line {rec.line}: C/D type {rec.c_type}/{rec.d_type} with {dt} inputs is not replayable "
                            f"(expected {out})")
    epi = (rec.epilogue or "DEFAULT").upper().replace("CUBLASLT_", "").replace("EPILOGUE_", "")
    if epi not in ("DEFAULT", "BIAS"):
        raise NotReplayable(f"line {rec.line}: epilogue {rec.epilogue} needs inputs the log does not record "
                            "(only the default and BIAS epilogues are replayed)")
    ta, tb = rec.op_a or "N", rec.op_b or "N"
    return {"dtype": dt, "m": rec.m, "n": rec.n, "k": rec.k, "trans_a": ta, "trans_b": tb,
            "lda": rec.lda, "ldb": rec.ldb, "ldc": rec.ldc, "batch": rec.batch_count or 1, "bias": epi == "BIAS",
            "workspace_bytes": rec.workspace_bytes or 0, "algo_id": rec.algo_id,
            "b_type": short_dtype(rec.b_type) if dt.startswith("fp8") else None, "out_of_place": bool(rec.out_of_place),
            "config": {"tile": rec.tile, "stages": rec.algo_stages, "cluster": rec.cluster,
                       "split_k": rec.num_splits_k if rec.num_splits_k and rec.num_splits_k > 1 else None,
                       "reduction_scheme": rec.reduction_scheme if rec.num_splits_k and rec.num_splits_k > 1 else None,
                       "custom_option": rec.custom_option or None, "cta_swizzling": rec.cta_swizzling or None}}


def replay(records, probe=None, reps: int = 10) -> list[dict]:
    """Replay trace records on the GPU. One result dict per record (error set when it could not run)."""
    from cublaslt_probe.analysis.evidence import consistency, main_kernel
    from cublaslt_probe.gpu import lt
    from cublaslt_probe.gpu.probe import Probe
    from cublaslt_probe.names import decode
    probe = probe or Probe(pipeline=False)  # GEMMs one at a time: no windows to overlap
    torch = probe.torch
    out = []
    for rec in records:
        res = {"line": rec.line, "function": rec.function, "logged": {"algo_id": rec.algo_id, "tile": rec.tile,
               "stages": rec.algo_stages, "cluster": rec.cluster, "split_k": rec.num_splits_k,
               "custom_option": rec.custom_option}, "error": None}
        out.append(res)
        try:
            pr = problem_from_record(rec)
        except NotReplayable as e:
            res["error"] = f"not replayable: {e}"
            continue
        res["problem"] = {k: v for k, v in pr.items() if k != "config"}
        try:
            p = lt.Problem(pr["m"], pr["n"], pr["k"], dtype=lt_types(pr["dtype"])[0], trans_a=pr["trans_a"],
                           trans_b=pr["trans_b"],
                           batch=pr["batch"], bias=pr["bias"], workspace_bytes=max(pr["workspace_bytes"], 0),
                           b_type=pr["b_type"], lda=pr["lda"], ldb=pr["ldb"], ldc=pr["ldc"])
            with probe.lt_gemm(p, out_of_place=pr["out_of_place"]) as g:
                algo = lt.pinned_algo(probe.lib, p, pr["algo_id"], pr["config"])
                fn = g.call(algo)
                fn()
                torch.cuda.synchronize()
                [ks] = probe.profile([fn])
                res["kernels"] = [n for n, _ in ks]
                res["kernel"] = main_kernel(res["kernels"])
                res["time_us"] = probe.time_gpu(fn, reps).median_us
                res["pinned_config"] = probe.lib.algo_config(algo)
                today = g.heuristic(1)
                res["heuristic_today"] = probe.lib.algo_config(today[0].algo) if today else None
                kn = decode(res["kernel"]) if res["kernel"] else None
                res["consistent_with_log"] = consistency(kn, rec)
                if res["heuristic_today"]:
                    h = res["heuristic_today"]
                    res["heuristic_agrees"] = (h["algo_id"] == rec.algo_id
                                               and (rec.tile is None or h["tile"] == rec.tile)
                                               and (rec.cluster is None or h["cluster"] == rec.cluster))
        except Exception as e:  # noqa: BLE001  a line that fails says why; the others still run
            res["error"] = error_text(e)
            torch.cuda.synchronize()
    return out


def render(results: list[dict]) -> str:
    from cublaslt_probe.names import decode
    lines = []
    for r in results:
        lg = r["logged"]
        head = (f"line {r['line']} {r['function']}: algoId={lg['algo_id']} tile={lg['tile']} stages={lg['stages']} "
                f"cluster={lg['cluster']} splitK={lg['split_k']} customOption={lg['custom_option']}")
        lines.append(head)
        if r.get("error"):
            lines.append(f"  {r['error']}")
            continue
        pr = r["problem"]
        lines.append(f"  rebuilt: {pr['dtype']} m={pr['m']} n={pr['n']} k={pr['k']} op(A)={pr['trans_a']} "
                     f"op(B)={pr['trans_b']} batch={pr['batch']}{' +bias' if pr['bias'] else ''} "
                     f"workspace={pr['workspace_bytes']} B")
        kn = decode(r["kernel"]) if r.get("kernel") else None
        lines.append(f"  launched: {r.get('kernel')}" + (f"  [{kn.family} {kn.short}]" if kn else ""))
        c = r.get("consistent_with_log")
        lines.append(f"  matches the logged algo (tile, cluster, split-K): "
                     f"{'yes' if c else 'NO' if c is False else 'nothing to compare'};  time {r['time_us']:.2f} µs")
        h = r.get("heuristic_today")
        if h:
            lines.append(f"  heuristic today: algoId={h['algo_id']} tile={h['tile']} stages={h['stages']} "
                         f"cluster={h['cluster']} splitK={h['split_k']} -> "
                         f"{'same choice' if r.get('heuristic_agrees') else 'a DIFFERENT choice'}")
    n_ok = sum(1 for r in results if not r.get("error"))
    n_match = sum(1 for r in results if r.get("consistent_with_log"))
    lines.append(f"\nreplayed {n_ok}/{len(results)} lines; {n_match} launched a kernel matching the logged algo")
    return "\n".join(lines)

