"""An MoE layer's experts as transformers 5.x runs them, rebuilt for `audit --measure` (`gpu.measure.measure_experts`
times each variant as one whole call): `experts_forward` (the gated experts forward, one variant per change the
advice can name: padded groups, one bmm, fp8, transformers' eager and batched_mm implementations), the fp8
helpers (`quant_rows`, `quant_weight`, the fp8 grouped linear) and `route` (a routing with given group sizes).
Imports torch inside functions (GPU side); which variants exist is `analysis.audit.plan.EXPERTS_VARIANTS`.
"""
from __future__ import annotations

from cublaslt_probe.analysis.audit.plan import EXPERTS_VARIANTS

F8_MAX = 448.0        # torch.finfo(torch.float8_e4m3fn).max


def silu_gate(h):
    """transformers' `_apply_gate` of gated experts (Mixtral, Qwen3-MoE, ...): act(gate) * up, gate first."""
    import torch
    g, u = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u


def quant_rows(t):
    """e4m3 copy of 2-D `t` and its row-wise scales (max |row| / F8_MAX)."""
    import torch
    s = (t.abs().amax(dim=-1).float() / F8_MAX).clamp_min(1e-12)
    return (t.float() / s.unsqueeze(-1)).to(torch.float8_e4m3fn), s


def quant_weight(w):
    """e4m3 copy of expert weights `w` [E, n, k] and their scales [E, n] (one per expert column of the GEMM)."""
    import torch
    s = (w.abs().amax(dim=2).float() / F8_MAX).clamp_min(1e-12)
    return (w.float() / s[..., None]).to(torch.float8_e4m3fn), s


_FP8: list = []


def _fp8_grouped():
    """A grouped linear x @ W^T (W [E, n, k], offsets along x's rows) with an fp8 forward (the activations
    quantized by `quant`, the weights given quantized) and the bf16 backward products autograd forms for
    `_grouped_mm` (data gradient: offsets along m; weight gradient: offsets along k)."""
    if _FP8:
        return _FP8[0]
    import torch

    class Fp8Grouped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, offs, w8, sw, quant):
            x8, sx = quant(x)
            ctx.save_for_backward(x, w, offs)
            return torch._scaled_grouped_mm(x8, w8.transpose(-2, -1), sx, sw, offs=offs, out_dtype=x.dtype)

        @staticmethod
        def backward(ctx, g):
            x, w, offs = ctx.saved_tensors
            gx = torch._grouped_mm(g, w, offs=offs) if ctx.needs_input_grad[0] else None
            gw = torch._grouped_mm(g.transpose(-2, -1), x, offs=offs) if ctx.needs_input_grad[1] else None
            return gx, gw, None, None, None, None
    _FP8.append(Fp8Grouped.apply)
    return _FP8[0]


def experts_forward(w1, w2, hidden, top_k_index, top_k_weights, *, variant: str = "original", gate=None,
                    fp8_weights=None):
    """An MoE layer's experts, gated, weights as transformers 5.x stores them (`w1` gate+up [E, 2I, H], `w2`
    down [E, H, I], no bias), run the way `variant` would really be built, gathers, padding and host
    synchronisations included:

    - ``original``: transformers' `grouped_mm` experts forward written out (token gather, argsort by expert,
      `histc` sizes, two `torch._grouped_mm`, the gate, the routing weights, the inverse permutation, the sum
      over top-k);
    - ``pad<M>``: the same with each expert's rows placed at a multiple of M (zero rows between the groups,
      offsets of the padded sizes, a host-side bound on the rows: no synchronisation), the real rows gathered
      back; under autograd the rows past the last group are zeroed after the first GEMM (its backward reads
      them);
    - ``bmm_padded``: every expert padded to the largest group, one `torch.bmm` per projection (the largest
      group read on the host: one synchronisation per call);
    - ``fp8``: ``original`` with both projections through `torch._scaled_grouped_mm` (e4m3, row-wise scales;
      `fp8_weights(w)` gives a projection's e4m3 weights and scales, the activations quantized each call in eager
      torch; the backward stays in the weights' dtype);
    - ``mm_per_group``: transformers' ``eager`` experts (a loop over the experts hit: `torch.where`, gather,
      two `linear`, `index_add_`; a host synchronisation per expert);
    - ``batched_mm``: transformers' ``batched_mm`` experts (each routed row's expert weights gathered, one
      `torch.bmm` of one-row products per projection).
    `gate` is the module's gate (`silu_gate` when None). Returns [tokens, H] in `hidden`'s dtype."""
    import torch
    gate = gate or silu_gate
    dev, E = hidden.device, w1.shape[0]
    T, k = top_k_index.shape
    S = T * k
    token_idx = torch.arange(T, device=dev).unsqueeze(1).expand(-1, k).reshape(-1)
    if variant == "mm_per_group":
        final = torch.zeros_like(hidden)
        with torch.no_grad():
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=E).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            e = e[0]
            if e == E:
                continue
            pos, tok = torch.where(mask[e])
            h = gate(torch.nn.functional.linear(hidden[tok], w1[e]))
            h = torch.nn.functional.linear(h, w2[e]) * top_k_weights[tok, pos, None]
            final.index_add_(0, tok, h.to(final.dtype))
        return final
    if variant == "batched_mm":
        ids = top_k_index.reshape(-1)
        h = gate(torch.bmm(w1[ids], hidden[token_idx].unsqueeze(-1)).squeeze(-1))
        y = torch.bmm(w2[ids], h.unsqueeze(-1)).squeeze(-1) * top_k_weights.reshape(-1).unsqueeze(-1)
        return y.view(T, k, -1).sum(dim=1).to(hidden.dtype)
    expert_ids = top_k_index.reshape(-1)
    selected = hidden[token_idx]
    perm = torch.argsort(expert_ids)
    inv_perm = torch.argsort(perm)
    ids_g = expert_ids[perm]
    w_g = top_k_weights.reshape(-1)[perm]
    x = selected[perm]
    counts = torch.histc(ids_g.int(), bins=E, min=0, max=E - 1)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)

    def proj(inp, w, o):
        if variant == "fp8":
            return _fp8_grouped()(inp, w, o, *fp8_weights(w), quant_rows)
        return torch._grouped_mm(inp, w.transpose(-2, -1), offs=o)
    if variant.startswith("pad"):
        mult = int(variant[3:])
        padded = (counts + (mult - 1)) // mult * mult
        poffs = torch.cumsum(padded, 0, dtype=torch.int32)
        dst = torch.arange(S, device=dev) + ((poffs - padded) - (offs - counts))[ids_g]
        rows = S + E * (mult - 1)
        h = proj(x.new_zeros(rows, x.shape[1]).index_put((dst,), x), w1, poffs)
        if torch.is_grad_enabled():
            h = h.masked_fill((torch.arange(rows, device=dev) >= poffs[-1]).unsqueeze(-1), 0)
        y = proj(gate(h), w2, poffs)[dst]
    elif variant == "bmm_padded":
        G = max(1, int(counts.max()))
        dst = torch.arange(S, device=dev) + (torch.arange(E, device=dev) * G - (offs - counts))[ids_g]
        xb = x.new_zeros(E * G, x.shape[1]).index_put((dst,), x)
        h = gate(torch.bmm(xb.view(E, G, -1), w1.transpose(1, 2)).view(E * G, -1))
        y = torch.bmm(h.view(E, G, -1), w2.transpose(1, 2)).view(E * G, -1)[dst]
    elif variant in ("original", "fp8"):
        y = proj(gate(proj(x, w1, offs)), w2, offs)
    else:
        raise ValueError(f"unknown experts variant {variant!r}: choose from {', '.join(EXPERTS_VARIANTS)}")
    y = (y * w_g.unsqueeze(-1))[inv_perm]
    return y.view(T, k, -1).sum(dim=1).to(hidden.dtype)


def route(torch, sizes: list[int], tokens: int, top_k: int, seed: int = 0):
    """top_k_index [tokens, top_k] on the GPU whose experts get `sizes` rows (each at most `tokens`), each token
    routed to top_k distinct experts, tokens in a seeded random order."""
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    idx = ids.view(top_k, tokens).t()
    gen = torch.Generator().manual_seed(seed)
    return idx[torch.randperm(tokens, generator=gen)].contiguous().cuda()
