"""A trace's GPU time by class: every kernel name's time summed by (kind, provenance, library, family), and the
summary sentence ("62.0 % library-selected cuBLAS GEMMs, ...") `trace` and `audit` print."""
from __future__ import annotations

import numpy as np
import pandas as pd

from cublaslt_probe.analysis.trace.schema import classify

# How the timeline's sentence writes the decoder's `library` (others as they are; no library: the family).
LIBRARY_NAMES = {"cublas": "cuBLAS", "cudnn": "cuDNN", "triton": "Triton", "cutlass": "CUTLASS", "nccl": "NCCL",
                 "flashinfer": "FlashInfer", "tensorrt_llm": "TensorRT-LLM", "deepgemm": "DeepGEMM"}

_KIND_WORDS = {"gemm": "GEMMs", "attention": "attention", "elementwise": "elementwise", "reduction": "reductions",
               "copy": "copies", "communication": "communication", "other": "other kernels"}

TIMELINE_SCHEMA: dict[str, tuple[str, str]] = {
    "kind": ("string", "what the kernel does: gemm, attention, elementwise, reduction, copy, communication, "
                       "other (cublaslt_probe.names.classes)"),
    "provenance": ("string", "how the kernel came to exist: library-selected, ahead-of-time, runtime-compiled, "
                             "unknown"),
    "library": ("string", "who ships or launches the kernel (decoded: cublas, cudnn, torch, triton, ...); "
                          "null when the name does not say"),
    "family": ("string", "decoded family"),
    "kernels": ("Int64", "distinct kernel names"),
    "launches": ("Int64", "launches (kernels, memcpy and memset rows)"),
    "total_us": ("float64", "summed duration, µs"),
    "share": ("float64", "fraction of the trace's GPU time"),
}


def timeline_frame(per_name: dict[str, list], gpu_time_us: float) -> pd.DataFrame:
    """GPU time of every kernel name, by (kind, provenance, family)."""
    from cublaslt_probe.names import decode
    acc: dict[tuple, list] = {}
    for name, (n, t) in per_name.items():
        kn = decode(name)
        kind, prov = classify(kn)
        a = acc.setdefault((kind, prov, kn.library, kn.family), [0, 0, 0.0])
        a[0] += 1
        a[1] += n
        a[2] += t
    df = pd.DataFrame([(*k, *v) for k, v in acc.items()], columns=list(TIMELINE_SCHEMA)[:-1])
    df["share"] = df["total_us"] / gpu_time_us if gpu_time_us else np.nan
    df = df.astype({c: dt for c, (dt, _) in TIMELINE_SCHEMA.items()})
    return df.sort_values(["total_us", "family"], ascending=[False, True], kind="stable").reset_index(drop=True)


def families(timeline: pd.DataFrame) -> pd.DataFrame:
    """GPU time per decoded family (the timeline summed over kind and provenance)."""
    df = timeline.groupby("family", sort=False, observed=True)[["kernels", "launches", "total_us", "share"]].sum()
    return df.reset_index().sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)


def timeline_groups(timeline: pd.DataFrame) -> pd.DataFrame:
    """The timeline in the words of its summary sentence: one row per (provenance, library, kind) with its
    ``label`` ("library-selected cuBLAS GEMMs"), ``total_us`` and ``share``, largest first. A kernel whose
    library the name does not say is counted under its family."""
    if not len(timeline):
        return pd.DataFrame(columns=["provenance", "library", "kind", "label", "total_us", "share"])
    lib = [LIBRARY_NAMES.get(lb, lb) if isinstance(lb, str) else f
           for lb, f in zip(timeline["library"].astype(object), timeline["family"])]
    g = (timeline.assign(library=lib).groupby(["provenance", "library", "kind"], sort=False, observed=True)
         [["total_us", "share"]].sum().reset_index())
    g["label"] = [f"{p} {lb} {_KIND_WORDS.get(k, k)}" for p, lb, k in
                  zip(g["provenance"], g["library"], g["kind"])]
    return g.sort_values(["total_us", "label"], ascending=[False, True], kind="stable").reset_index(drop=True)


def timeline_sentence(timeline: pd.DataFrame, top: int = 6) -> str:
    """"62.0 % library-selected cuBLAS GEMMs, 21.0 % runtime-compiled Triton elementwise, …"."""
    g = timeline_groups(timeline)
    if not len(g):
        return "no GPU time"
    parts = [f"{100 * s:.1f} % {lb}" for lb, s in zip(g["label"].head(top), g["share"].head(top))]
    rest = g["share"].iloc[top:].sum()
    if len(g) > top:
        parts.append(f"{100 * rest:.1f} % in {len(g) - top} more groups")
    return ", ".join(parts)
