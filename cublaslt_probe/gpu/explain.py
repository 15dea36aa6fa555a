"""The GPU half of `explain`: one GEMM through the probe, the heuristic's candidates beside it, and optionally
its first-call anatomy (`firstcall`), gathered into the evidence `analysis.explain.analyse` reads."""
from __future__ import annotations

from cublaslt_probe.errors import error_text


def gather(case, *, top: int = 32, first_call: bool = False, probe=None) -> dict:
    """Run the GEMM through the probe, its candidates, optionally the first-call anatomy (GPU)."""
    from cublaslt_probe.analysis.candidates import compact
    from cublaslt_probe.analysis.evidence import heuristic_workspace
    from cublaslt_probe.gpu.alternatives import lt_candidates
    from cublaslt_probe.gpu.probe import Probe
    probe = probe or Probe(pipeline=False)  # one GEMM: nothing to overlap
    [rec] = probe.run_window([case])
    ev = {"case": case.as_dict(), "env": probe.env, "record": rec}
    ws = heuristic_workspace(case.backend, case.op, case.n, case.k)
    try:
        ev["candidates"] = [compact(r) for r in lt_candidates(probe, case, top=top, workspace_bytes=ws)]
        ev["candidates_workspace"] = ws
    except Exception as e:  # noqa: BLE001
        ev["candidates_error"] = error_text(e)
    if first_call:
        from cublaslt_probe.gpu import firstcall
        ev["first_call"] = firstcall.analyse(firstcall.run(case.key))
    return ev
