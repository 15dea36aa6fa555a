"""A grouped GEMM's variants against the original's output on its own operands (`gpu.measure.measure_grouped`'s
numerics): every group padded with zero rows (or, for the weight gradient, along k) and read back, all groups
padded to the largest as one `torch.bmm`, fp8 with row-wise scales, and outputs other variants already made. The
figure is `analysis.candidates.max_rel_diff` (max |y - y0| / max |y0|). Runs on the GPU (torch is the probe's).
"""
from __future__ import annotations

import logging

from cublaslt_probe.analysis.candidates import max_rel_diff

log = logging.getLogger(__name__)


def padded_rows(torch, sizes: list[int], padded: list[int]):
    """(the rows of the padded problem that hold the original groups' rows, in order; the padded problem's
    offsets as torch's grouped GEMM takes them): group g's rows start where the padded groups before it end."""
    ends = [0]
    for x in padded:
        ends.append(ends[-1] + x)
    idx = torch.cat([torch.arange(ends[g], ends[g] + c, device="cuda") for g, c in enumerate(sizes)])
    return idx, torch.tensor(ends[1:], dtype=torch.int32, device="cuda")


def grouped_numerics(probe, alts: dict, a, w, offs, ref, extra: dict) -> dict:
    """Max |y - y0| / max |y0| against the grouped GEMM's output `ref` on its own operands: every group
    padded with zero rows (the real rows read back), all groups padded to the largest in one `torch.bmm`, fp8
    (row-wise scales from each row's and each expert column's max), and the outputs already made
    (`extra`: name -> output in group order). Balanced sizes are another routing: not compared."""
    torch = probe.torch
    sizes = alts["original"].group_sizes()
    starts = [0]
    for x in sizes:
        starts.append(starts[-1] + x)
    out: dict[str, float | None] = {}
    if alts["original"].split_k:
        return split_k_numerics(torch, alts, a, w, ref, sizes, starts, extra)

    def rel(y) -> float:
        return max_rel_diff(y.float(), ref)

    def put(name, make):
        try:
            out[name] = rel(make())
        except Exception as e:  # noqa: BLE001
            out[name] = None
            log.info("numerics of %s failed: %s", name, e)
    for name, alt in alts.items():
        if name.startswith("pad"):
            def padded(alt=alt):
                idx, po = padded_rows(torch, sizes, alt.group_sizes())
                ap = torch.zeros(alt.m, a.shape[1], device="cuda", dtype=a.dtype)
                ap[idx] = a
                return torch._grouped_mm(ap, w, offs=po)[idx]
            put(name, padded)
        elif name == "bmm_padded":
            def bmm():
                big = max(sizes)
                ab = torch.zeros(len(sizes), big, a.shape[1], device="cuda", dtype=a.dtype)
                for g, n in enumerate(sizes):
                    ab[g, :n] = a[starts[g]:starts[g] + n]
                y = torch.bmm(ab, w)
                return torch.cat([y[g, :n] for g, n in enumerate(sizes)])
            put(name, bmm)
        elif name == "fp8":
            def fp8():
                f8 = torch.float8_e4m3fn
                top = torch.finfo(f8).max
                sa = (a.float().abs().amax(dim=1) / top).clamp_min(1e-12)
                sb = (w.float().abs().amax(dim=1) / top).clamp_min(1e-12)          # [groups, n]
                a8 = (a.float() / sa[:, None]).to(f8)
                w8 = (w.float() / sb[:, None, :]).to(f8).transpose(-1, -2).contiguous().transpose(-1, -2)
                return torch._scaled_grouped_mm(a8, w8, sa, sb, offs=offs, out_dtype=torch.bfloat16)
            put(name, fp8)
    for name, y in extra.items():
        put(name, lambda y=y: y)
    return out


def split_k_numerics(torch, alts: dict, a, w, ref, sizes: list[int], starts: list[int], extra: dict) -> dict:
    """`grouped_numerics` of a split-k grouped GEMM (A [m, K] column-major, B [K, n], output [groups, m, n]):
    every group padded along k with zero rows of A's columns and B's rows, and every group padded to the largest
    as one `torch.bmm`, each against the original's output, the empty groups' outputs left out."""
    live = [g for g, n in enumerate(sizes) if n]
    out: dict[str, float | None] = {}

    def put(name, make):
        try:
            out[name] = max_rel_diff(make().float()[live], ref[live])
        except Exception as e:  # noqa: BLE001
            out[name] = None
            log.info("numerics of %s failed: %s", name, e)
    m, n = a.shape[0], w.shape[1]
    for name, alt in alts.items():
        if name.startswith("pad"):
            def padded(alt=alt):
                idx, po = padded_rows(torch, sizes, alt.group_sizes())
                ap = torch.zeros(alt.k, m, device="cuda", dtype=a.dtype)
                ap[idx] = a.t()
                bp = torch.zeros(alt.k, n, device="cuda", dtype=w.dtype)
                bp[idx] = w
                return torch._grouped_mm(ap.t(), bp, offs=po)
            put(name, padded)
        elif name == "bmm_padded":
            def bmm():
                big = max(sizes)
                ab = torch.zeros(len(sizes), m, big, device="cuda", dtype=a.dtype)
                bb = torch.zeros(len(sizes), big, n, device="cuda", dtype=w.dtype)
                for g, c in enumerate(sizes):
                    ab[g, :, :c] = a[:, starts[g]:starts[g] + c]
                    bb[g, :c] = w[starts[g]:starts[g] + c]
                return torch.bmm(ab, bb)
            put(name, bmm)
    for name, y in extra.items():
        put(name, lambda y=y: y)
    return out
