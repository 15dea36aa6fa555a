"""Advice proven in the program's own step: each item applied to the live program, the step timed A/B.

`prove(step, model, items, ...)` takes the program's step (a zero-argument callable), its model and the audit's
advice items (`analysis.audit.advice`'s dicts). For each item it finds an applier (`applier_for`), checks the
applier's numerics on an input the module really saw, then runs rounds that alternate the original and the variant
(a warm-up step after each switch, each step between CUDA events on torch's current stream:
`timing.step_block_us`; more rounds while the saving's spread is wide: `analysis.proof.settled`), and restores the
program. The original-against-original rounds,
run once, give the noise floor. The model's parameters and buffers, the optimizer's state when one is given, and the
RNG states are saved before and put back after, so the program continues from where it was, bit for bit. The
statistics, the verdict and the file live in `analysis.proof`.

Appliers (each reversible; `apply()` then `restore()` leaves the module as it was):
- `PadLinear`: an `nn.Linear`'s output features (n) or input features (k) padded with zeros to the advised size,
  the result sliced back (output) or the input padded with zeros per call (input, a copy the change costs): the
  forward and backward GEMMs run at the padded size, and the parameter's storage becomes the head rows (columns)
  of the padded buffer, so the optimizer's updates reach the padded weight and gradients reach the parameter.
  A value that is some linears' output and others' input (a hidden width between two layers) pads each linear
  on its own side (`PadWidth`), every module's output sliced back to what it was.
- `BlasPath`: torch's BLAS switch (`torch.backends.cuda.preferred_blas_library`).
- `ExpertsImplementation`: transformers' experts implementation (`set_experts_implementation`).
- `BalancedRouting`: a what-if, labelled so: the router's top-k indices replaced by a balanced assignment, the
  upper bound of a router change (the model then computes something else).
- `PinLinears`: a heuristic candidate's algo pinned on an `nn.Linear`'s forward (`gpu.pin`), for the GEMM's
  token count: the way a pin reaches a program on torch 2.11.
A cuBLASLt workspace (`FRESH_KINDS`), which torch reads once before its first cuBLASLt handle, is proven in fresh
processes when the program's script is given (`prove(..., script=[SCRIPT, ARGS])`, as `cublaslt-probe prove` does):
`FRESH_ROUNDS` pairs of children (`gpu.prove_child`: the original, and the variant with torch's BLAS preference
and CUBLASLT_WORKSPACE_SIZE set, the order alternating), against `FRESH_NOISE` original-against-original pairs run
once per proof, summarised as the live rounds are (`fresh_summary`). A round costs two starts of the program (torch
imported, the script loaded, `FRESH_WARMUP` + `FRESH_BLOCKS` × `FRESH_STEPS` steps each, `FRESH_TIMEOUT_S` at most);
with the defaults an item takes 16 children.
Everything else is *unproven* with the reason: token (m) padding is the program's input; a workspace without the
program's script; a backward GEMM's pin; a grouped change that restructures the experts layer (one bmm, fp8, padded
groups).
"""
from __future__ import annotations

import copy
import fnmatch
import json
import math
import os
import statistics
import subprocess
import sys
import time

from cublaslt_probe.analysis.proof import MORE_ROUNDS, kernel_split, settled, summarize
from cublaslt_probe.gpu import prove_child
from cublaslt_probe.gpu.timing import step_block_us

ROUNDS = 9          # alternating rounds per item (and of the noise floor)
STEPS = 3           # timed steps per block
WARMUP = 1          # untimed steps after each switch


class Unproven(Exception):
    """An item that cannot be applied to this program: the message says why."""


def _modules(model, pattern: str | None) -> list[tuple[str, object]]:
    """The model's modules a name or pattern names (`model.layers.*.mlp.down_proj`, a `×N` suffix ignored)."""
    if not pattern:
        return []
    pat = pattern.split(" ×")[0].strip()
    return [(n, m) for n, m in model.named_modules() if n == pat or fnmatch.fnmatchcase(n, pat)]


class PadLinear:
    """Pads the `dim` ("out" or "in") features of every `nn.Linear` in `mods` from `old` to `new`."""

    def __init__(self, torch, mods: list, dim: str, old: int, new: int):
        self.torch, self.mods, self.dim, self.old, self.new = torch, mods, dim, old, new
        self._saved: list = []

    def apply(self) -> None:
        torch = self.torch
        fn = _padded_linear(torch)
        for _name, m in self.mods:
            w, b = m.weight, m.bias
            if self.dim == "out":
                big = torch.zeros((self.new, w.shape[1]), dtype=w.dtype, device=w.device)
                bigb = None if b is None else torch.zeros(self.new, dtype=b.dtype, device=b.device)
            else:
                big = torch.zeros((w.shape[0], self.new), dtype=w.dtype, device=w.device)
                bigb = None
            with torch.no_grad():
                head = big[: self.old] if self.dim == "out" else big[:, : self.old]
                head.copy_(w)
                self._saved.append((m, w.data, None if b is None else b.data))
                w.data = head               # the parameter's storage lies inside the padded buffer
                if self.dim == "out" and b is not None:
                    bigb[: self.old].copy_(b)
                    b.data = bigb[: self.old]
            m.forward = _padded_forward(torch, fn, m, big, bigb, self.dim, self.old, self.new)

    def restore(self) -> None:
        torch = self.torch
        for m, wdata, bdata in self._saved:
            with torch.no_grad():
                wdata.copy_(m.weight.data)
                m.weight.data = wdata
                if bdata is not None:
                    bdata.copy_(m.bias.data)
                    m.bias.data = bdata
            del m.forward
        self._saved = []


def _padded_forward(torch, fn, m, big, bigb, dim: str, old: int, new: int):
    """The forward a padded linear runs: with gradients, the autograd function (`_padded_linear`); without,
    the same GEMM in plain torch ops, which torch.compile traces without a graph break. A closure without
    default arguments (torch.compile guards a function's defaults)."""
    F = torch.nn.functional

    def forward(x):
        if torch.is_grad_enabled() and m.weight.requires_grad:
            return fn.apply(x, m.weight, m.bias, big, bigb, dim, old, new)
        if dim == "out":
            return F.linear(x, big, bigb)[..., :old]
        return F.linear(F.pad(x, (0, new - old)), big, m.bias)
    return forward


def _graph_breaks() -> int:
    """torch.compile's graph breaks so far in this process (0 where torch._dynamo cannot tell)."""
    try:
        from torch._dynamo.utils import counters
        return int(sum(counters["graph_break"].values()))
    except Exception:  # noqa: BLE001  (a torch without these counters: nothing to compare)
        return 0


def _padded_linear(torch):
    """The autograd function of a padded linear: forward and backward GEMMs at the padded size, the output
    sliced back (out) or the input padded with zeros (in), the weight's gradient cut to the parameter's size."""
    F = torch.nn.functional

    class PaddedLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, big, bigb, dim, old, new):
            if dim == "out":
                y = F.linear(x, big, bigb)
                ctx.save_for_backward(x, big)
                ctx.cfg = (dim, old, new, b is not None)
                return y[..., :old]
            xp = F.pad(x, (0, new - old))
            ctx.save_for_backward(xp, big)
            ctx.cfg = (dim, old, new, b is not None)
            return F.linear(xp, big, b)

        @staticmethod
        def backward(ctx, gy):
            x, big = ctx.saved_tensors
            dim, old, new, has_b = ctx.cfg
            if dim == "out":
                gy = F.pad(gy, (0, new - old))
            g2 = gy.reshape(-1, gy.shape[-1])
            gx = gw = gb = None
            if ctx.needs_input_grad[0]:
                gx = gy @ big
                if dim == "in":
                    gx = gx[..., :old]
            if ctx.needs_input_grad[1]:
                gw = g2.t() @ x.reshape(-1, x.shape[-1])
                gw = gw[:old] if dim == "out" else gw[:, :old]
            if has_b and ctx.needs_input_grad[2]:
                gb = g2.sum(0)
                gb = gb[:old] if dim == "out" else gb
            return gx, gw, gb, None, None, None, None, None

    return PaddedLinear


class BlasPath:
    """torch's BLAS switch set to `lib` ('cublaslt' | 'cublas')."""

    def __init__(self, torch, lib: str):
        self.torch, self.lib, self._was = torch, lib, None

    def apply(self) -> None:
        self._was = self.torch.backends.cuda.preferred_blas_library()
        self.torch.backends.cuda.preferred_blas_library(self.lib)

    def restore(self) -> None:
        self.torch.backends.cuda.preferred_blas_library(self._was)


PATHS = {"torch-lt": "cublaslt", "torch": "cublas"}
IMPLEMENTATIONS = {"mm_per_group": "eager", "batched_mm": "batched_mm"}   # advice variant: transformers' name


class ExpertsImplementation:
    """transformers' experts implementation of the model set to `impl` (`set_experts_implementation`)."""

    def __init__(self, model, impl: str):
        self.model, self.impl, self._was = model, impl, None

    def apply(self) -> None:
        self._was = getattr(self.model.config, "_experts_implementation", None) or "grouped_mm"
        self.model.set_experts_implementation(self.impl)

    def restore(self) -> None:
        self.model.set_experts_implementation(self._was)


class BalancedRouting:
    """A what-if, not a change: the routers' top-k expert indices replaced by a balanced assignment (token t to
    experts (t*k + j) mod E), and a per-expert count beside them recomputed, through forward hooks on the
    modules whose output carries them (`routers`). It bounds what a router change could save; which tokens
    each expert sees changes, so the model computes something else."""

    def __init__(self, torch, routers: list, experts: int):
        self.torch, self.routers, self.experts, self._hooks = torch, routers, experts, []
        self._at: dict[int, int | None] = {}

    def _index_at(self, router, items: list) -> int | None:
        """Where the router's output holds the expert indices (an integer [tokens, k] tensor whose values are
        expert ids), found at the router's first call and kept: the look at the values reads them on the host,
        and a read at every call would stall the GPU's queue once per layer per step, timing the hook instead
        of the what-if."""
        key = id(router)
        if key not in self._at:
            torch, E = self.torch, self.experts
            at = [i for i, t in enumerate(items) if torch.is_tensor(t) and not t.is_floating_point()
                  and t.dim() == 2 and t.numel() and int(t.max()) < E]
            self._at[key] = at[0] if at else None
        return self._at[key]

    def _balance(self, router, out):
        torch, E = self.torch, self.experts
        items = list(out) if isinstance(out, tuple) else [out]
        i = self._index_at(router, items)
        if i is None or i >= len(items) or not torch.is_tensor(items[i]) or items[i].dim() != 2:
            return out
        T, k = items[i].shape
        dev = items[i].device
        bal = (torch.arange(T * k, device=dev) % E).view(T, k).to(items[i].dtype)
        items[i] = bal
        # the balanced counts without a host read (torch.bincount reads its input's maximum on the host)
        counts = (T * k) // E + (torch.arange(E, device=dev) < (T * k) % E).long()
        for j, t in enumerate(items):
            if j != i and torch.is_tensor(t) and not t.is_floating_point() and t.dim() == 1 and t.numel() == E:
                items[j] = counts.to(t.dtype)
        return tuple(items) if isinstance(out, tuple) else items[0]

    def apply(self) -> None:
        self._hooks = [r.register_forward_hook(lambda m, a, out: self._balance(m, out)) for r in self.routers]

    def restore(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _routers(torch, model, experts_pattern: str | None, groups: int | None) -> list:
    """The modules beside an experts module whose output carries top-k expert indices: the experts module's
    siblings that return an integer [tokens, k] tensor with values below the number of experts, found by one
    forward of each sibling's recorded output (hooks during one step are set by the caller)."""
    out = []
    for name, _ in _modules(model, experts_pattern):
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        out += [m for n, m in parent.named_children() if f"{name.rsplit('.', 1)[0]}.{n}" != name]
    return out


class PadWidth:
    """Pads a value that is the output features of some linears and the input features of others (a hidden
    width between two layers): one `PadLinear` per side, applied together and restored in reverse order."""

    def __init__(self, parts: list):
        self.parts = parts
        self.mods = [nm for p in parts for nm in p.mods]

    def apply(self) -> None:
        for p in self.parts:
            p.apply()

    def restore(self) -> None:
        for p in reversed(self.parts):
            p.restore()


def _pad_applier(torch, mods: list, pattern: str | None, old: int, new: int):
    """The applier that pads `old` → `new` in the modules a pad item names: each `nn.Linear` on the side where
    its features are `old` (output, input, or one side on some linears and the other on others: `PadWidth`).
    Modules the pattern also matches that hold no weight of that size (a container, an activation) change
    nothing; one that does and is not a linear cannot be padded here, and a linear with `old` on both sides
    is ambiguous: both raise Unproven."""
    lin = [(n, m) for n, m in mods if isinstance(m, torch.nn.Linear)]
    held = [n for n, m in mods if not isinstance(m, torch.nn.Linear)
            and any(old in p.shape for p in m.parameters(recurse=False))]
    if held or not lin:
        raise Unproven(f"{held[0] if held else pattern}: not an nn.Linear (only a linear's features can be padded "
                       "here)")
    both = [n for n, m in lin if m.out_features == old and m.in_features == old]
    if both:
        raise Unproven(f"{old} is both the input and the output features of {both[0]}: which to pad is ambiguous")
    outs = [(n, m) for n, m in lin if m.out_features == old]
    ins = [(n, m) for n, m in lin if m.in_features == old]
    if not outs and not ins:
        raise Unproven(f"{old} is the number of tokens (m): the program's input, which the tool cannot pad")
    parts = ([PadLinear(torch, outs, "out", old, new)] if outs else []) + (
        [PadLinear(torch, ins, "in", old, new)] if ins else [])
    return parts[0] if len(parts) == 1 else PadWidth(parts)


def applier_for(torch, model, item: dict):
    """The applier of one advice item, or raises Unproven saying why it cannot be applied."""
    kind, change = item.get("kind"), item.get("change") or {}
    if kind == "pad":
        mods = _modules(model, item.get("module"))
        if not mods:
            raise Unproven(f"no module of the model is named {item.get('module')!r}")
        old, new = change.get("from"), change.get("to")
        if not (isinstance(old, int) and isinstance(new, int) and new > old):
            raise Unproven("the item does not say which value to pad to which")
        return _pad_applier(torch, mods, item.get("module"), old, new)
    if kind == "path":
        lib = PATHS.get(change.get("path"))
        if lib is None:
            raise Unproven(f"path {change.get('path')!r} has no torch switch")
        return BlasPath(torch, lib)
    if kind in FRESH_KINDS:
        raise Unproven("a workspace size takes effect before torch's first cuBLASLt handle: it is proven in fresh "
                       "processes of the program's script (`cublaslt-probe prove RUN --from M -- SCRIPT.py`, or "
                       "prove(..., script=[SCRIPT, ARGS...])), not in a live step")
    if kind == "pin":
        return _pin_applier(torch, model, item, change)
    if kind == "grouped":
        variant = change.get("variant")
        if variant in IMPLEMENTATIONS:
            if not hasattr(model, "set_experts_implementation"):
                raise Unproven("the model has no set_experts_implementation (not a transformers MoE model)")
            return ExpertsImplementation(model, IMPLEMENTATIONS[variant])
        if variant == "balanced":
            groups = change.get("groups")
            if not isinstance(groups, int) or groups < 2:
                raise Unproven("the item does not say how many experts the router picks from")
            routers = _routers(torch, model, item.get("module"), groups)
            if not routers:
                raise Unproven(f"no module beside {item.get('module')!r} to carry the router's choice")
            return BalancedRouting(torch, routers, groups)
        raise Unproven(f"the change ({variant or 'grouped'}) restructures the experts layer: no applier rebuilds "
                       "it in a program; measure it by hand")
    raise Unproven(f"no applier for advice of kind {kind!r}")


class PinLinears:
    """A candidate's algo pinned on the forward of every `nn.Linear` in `mods` (`gpu.pin`), for `tokens` rows."""

    def __init__(self, mods: list, algo: dict, tokens: int):
        self.mods, self.algo, self.tokens, self._pins = mods, algo, tokens, []

    def apply(self) -> None:
        """The pins made once and attached again at every switch: the same forwards each round, so a compiled
        program compiles the pinned variant once (new pins each round recompile it until torch.compile's
        cache limit sends it to eager)."""
        from cublaslt_probe.gpu.pin import pin_linear
        if self._pins:
            for p in self._pins:
                p.attach()
        else:
            self._pins = [pin_linear(m, self.algo, tokens=self.tokens) for _, m in self.mods]

    def restore(self) -> None:
        for p in self._pins:
            p.detach()

    def close(self) -> None:
        for p in self._pins:
            p.remove()
        self._pins = []


def _pin_applier(torch, model, item: dict, change: dict):
    """The pin of a forward GEMM of `nn.Linear` modules: the GEMM's problem (torch's m tokens, n out features,
    k in features) must be the modules' own; a backward GEMM's pin cannot be applied (torch runs it)."""
    algo, key = change.get("algo"), change.get("key") or {}
    if not isinstance(algo, dict) or algo.get("algo_id") is None:
        raise Unproven("the item does not carry the candidate's algo config")
    if change.get("pass") not in (None, "fwd"):
        raise Unproven(f"a {change.get('pass')} GEMM: its pin would need torch's backward replaced")
    mods = _modules(model, item.get("module"))
    lin = [(n, m) for n, m in mods if isinstance(m, torch.nn.Linear)]
    if not lin or len(lin) != len(mods):
        raise Unproven(f"{item.get('module')}: not an nn.Linear (a pin is applied on a linear's forward)")
    if not all(key.get("n") == m.out_features and key.get("k") == m.in_features for _, m in lin):
        raise Unproven(f"the pinned GEMM ({key.get('m')}x{key.get('n')}x{key.get('k')}) is not the forward of "
                       f"{item.get('module')}")
    if not isinstance(key.get("m"), int) or (key.get("batch") or 1) != 1:
        raise Unproven("the pinned GEMM's token count is not known")
    return PinLinears(lin, algo, key["m"])


class _State:
    """The model's parameters and buffers, an optimizer's state and the RNG states, saved and put back."""

    def __init__(self, torch, model, optimizer=None):
        self.torch, self.model, self.opt = torch, model, optimizer
        self.tensors = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
        self.grads = {k: (None if p.grad is None else p.grad.detach().clone()) for k, p in model.named_parameters()}
        self.opt_state = None if optimizer is None else copy.deepcopy(optimizer.state_dict())
        self.rng = torch.get_rng_state(), torch.cuda.get_rng_state_all()

    def restore(self) -> None:
        torch = self.torch
        with torch.no_grad():
            for k, v in self.model.state_dict(keep_vars=True).items():
                v.copy_(self.tensors[k])
            for k, p in self.model.named_parameters():
                g = self.grads[k]
                if g is None:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.copy_(g)
                else:
                    p.grad = g.clone()
        if self.opt is not None:
            self.opt.load_state_dict(self.opt_state)
        torch.set_rng_state(self.rng[0])
        torch.cuda.set_rng_state_all(self.rng[1])

    def same(self) -> list[str]:
        """The names of the tensors that differ from the saved ones (bit for bit)."""
        return [k for k, v in self.model.state_dict(keep_vars=True).items()
                if not self.torch.equal(v.detach(), self.tensors[k])]


def _rounds(torch, step, on, off, rounds: int, steps: int, warmup: int, block=step_block_us) -> tuple[list, list]:
    """Alternating rounds: original block, then variant block (switched on, warmed up), switched off again; a
    block is `block(torch, step, steps)` (default: the steps' GPU spans)."""
    orig, var = [], []
    for _ in range(rounds):
        for _ in range(warmup):
            step()
        orig.append(block(torch, step, steps))
        on()
        try:
            for _ in range(warmup):
                step()
            var.append(block(torch, step, steps))
        finally:
            off()
    return orig, var


def _recorded_block(torch, step, n: int) -> list[tuple[int, str, float]]:
    """n steps under CUPTI (`kernel_capture.recorded`): every kernel, memset and copy they ran."""
    from cublaslt_probe.gpu.kernel_capture import recorded

    def block():
        for _ in range(n):
            step()
    return recorded(torch, block)


def _in_step_kernels(torch, step, on, off, steps: int, warmup: int) -> dict:
    """The step's kernels with the change off, then on: one round of `_rounds` whose blocks are recorded by CUPTI
    (`_recorded_block`), split by `analysis.proof.kernel_split`; ``{"why": ...}`` where CUPTI cannot record
    (another profiler holds it, no CUPTI library)."""
    from cublaslt_probe.errors import CaptureError
    try:
        (original,), (variant,) = _rounds(torch, step, on, off, 1, steps, warmup, _recorded_block)
    except (CaptureError, OSError) as e:
        return {"why": f"CUPTI could not record the step's kernels: {str(e).splitlines()[0] if str(e) else e}"}
    return kernel_split(original, variant, steps)


def _numerics(torch, applier, sample) -> dict:
    """The applied module's output against the original on an input it saw: max |Δ| over max |y|
    (`candidates.max_rel_diff`), within the dtype's tolerance (`candidates.tolerance`), and the shapes equal (a padded
    or pinned linear; other appliers change
    what the program computes on purpose, or nothing of it, and are not compared)."""
    if not isinstance(applier, (PadLinear, PinLinears)) or sample is None:
        return {"checked": False}
    m, x = sample[0], sample[1]
    with torch.no_grad():
        y0 = m(x)
        applier.apply()
        try:
            y1 = m(x)
        finally:
            applier.restore()
    if y0.shape != y1.shape:
        return {"checked": True, "ok": False, "why": f"shape {tuple(y1.shape)} instead of {tuple(y0.shape)}"}
    from cublaslt_probe.analysis.candidates import max_rel_diff, tolerance
    from cublaslt_probe.gpu.pin import problem_dtype
    err = max_rel_diff(y1.float(), y0.float())
    tol = tolerance(problem_dtype(torch, y0.dtype) or "fp32")
    return {"checked": True, "ok": bool(math.isfinite(err) and err <= tol), "rel_err": err, "tolerance": tol}


def _sample_input(torch, step, mods: list):
    """One input the first of `mods` really saw, from a forward pre-hook during one step of the program:
    ``(module, input, calls, grad)`` with the module's forward calls in the step and whether its forward ran
    with gradients; None without modules or calls."""
    if not mods:
        return None
    m = mods[0][1]
    seen, calls = [], [0]

    def hook(mod, args):
        calls[0] += 1
        if not seen:
            w = getattr(mod, "weight", None)
            grad = torch.is_grad_enabled() and w is not None and w.requires_grad
            seen.append((args[0].detach().clone(), grad))
    h = m.register_forward_pre_hook(hook)
    try:
        step()
    finally:
        h.remove()
    return (m, seen[0][0], calls[0], seen[0][1]) if seen else None


def applier_cost(torch, applier, sample) -> dict | None:
    """What a padded linear (`PadLinear`) adds around its GEMMs per step, timed on the item's own sizes: for
    output features, the sliced output made contiguous (by a consumer that needs it, as a loss does) and, with
    gradients, the output's gradient padded back; for input features, the input padded and, with gradients, the
    input's gradient made contiguous. Each copy's GPU time × the modules × their calls per step. The GEMMs'
    prediction does not see these copies; the proof's does (`predicted_us` less ``us``). None for other
    appliers or without a sample."""
    if not isinstance(applier, PadLinear) or sample is None:
        return None
    _m, x, calls, grad = sample
    F = torch.nn.functional
    tokens, old, new = x.numel() // x.shape[-1], applier.old, applier.new
    wide = torch.empty((tokens, new), dtype=x.dtype, device=x.device)
    narrow = torch.empty((tokens, old), dtype=x.dtype, device=x.device)
    if applier.dim == "out":
        ops = [("the sliced output made contiguous", lambda: wide[:, :old].contiguous())]
        ops += [("its gradient padded", lambda: F.pad(narrow, (0, new - old)))] if grad else []
    else:
        ops = [("the input padded", lambda: F.pad(narrow, (0, new - old)))]
        ops += [("the input's gradient made contiguous", lambda: wide[:, :old].contiguous())] if grad else []
    n = len(applier.mods) * calls
    from cublaslt_probe.gpu.timing import per_call_us
    parts = {what: per_call_us(torch, fn) * n for what, fn in ops}
    return {"us": sum(parts.values()), "parts": parts, "tokens": tokens, "calls": n}


def _worst(checks: list[dict]) -> dict:
    """One numerics record of several parts': a failed one first, else the largest relative error checked."""
    done = [c for c in checks if c.get("checked")]
    if not done:
        return {"checked": False}
    bad = [c for c in done if not c["ok"]]
    return bad[0] if bad else max(done, key=lambda c: c.get("rel_err", 0.0))


def _summed(costs: list[dict]) -> dict | None:
    """One applier cost of several parts' (`applier_cost`): their copies' times added, per copy and in all."""
    if not costs:
        return None
    parts: dict = {}
    for c in costs:
        for what, us in c["parts"].items():
            parts[what] = parts.get(what, 0.0) + us
    return {"us": sum(c["us"] for c in costs), "parts": parts, "tokens": costs[0]["tokens"],
            "calls": sum(c["calls"] for c in costs)}


def _prove_item(torch, step, ap, it: dict, rec: dict, noise: list, rounds: int, steps: int, warmup: int,
                n: int, of: int, say, t1: float) -> dict:
    """One item's record: its numerics and the applier's own cost checked, then the alternating rounds."""
    if isinstance(ap, BalancedRouting):
        rec["what_if"] = ("the router forced to a balanced assignment: the upper bound of a router change, "
                          "not a change (the model computes something else)")
    parts = getattr(ap, "parts", [ap])          # a PadWidth checks and costs each side on its own input
    samples = [_sample_input(torch, step, getattr(p, "mods", [])) for p in parts]
    rec["numerics"] = _worst([_numerics(torch, p, x) for p, x in zip(parts, samples)])
    cost = _summed([c for p, x in zip(parts, samples) if (c := applier_cost(torch, p, x)) is not None])
    if cost is not None:
        rec["applier_cost"] = cost
    head = f"prove {n}/{of}: {it.get('what')}"
    if rec["numerics"].get("checked") and not rec["numerics"]["ok"]:
        say(f"{head}: failed (numerics)")
        return {**rec, "status": "failed", "why": "the applied module's output differs: "
                + rec["numerics"].get("why", f"relative error {rec['numerics']['rel_err']:.3g}")}
    breaks = _graph_breaks()
    try:
        a, b = _rounds(torch, step, ap.apply, ap.restore, rounds, steps, warmup)
        s = summarize(a, b, noise)
        while not settled(s) and len(a) < MORE_ROUNDS * rounds:     # a noisy saving: more rounds
            a2, b2 = _rounds(torch, step, ap.apply, ap.restore, rounds, steps, warmup)
            a, b = a + a2, b + b2
            s = summarize(a, b, noise)
    # the program's own error under the variant: the item failed, the run goes on
    except Exception as e:  # noqa: BLE001
        say(f"{head}: failed ({e.__class__.__name__})")
        return {**rec, "status": "failed", "why": f"the step failed under the change: "
                f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    broke = _graph_breaks() - breaks
    if broke:      # the applier's own forward split a compiled program: the rounds timed the applier
        say(f"{head}: failed ({broke} graph breaks)")
        return {**rec, "status": "failed", **s, "why": (
            f"the applier broke the compiled program's graphs ({broke} graph breaks while it was on): the "
            "rounds timed the applier, not the change; apply the change in the model's code and compare")}
    kernels = _in_step_kernels(torch, step, ap.apply, ap.restore, steps, warmup)
    less = f" less the applier's copies {cost['us']:,.1f}" if cost else ""
    in_step = (f"; its kernels in the step {kernels['saving_us']:,.1f}" if "saving_us" in kernels else "")
    say(f"{head}: {s['proven_us']:,.1f} µs/step [{s['spread_us'][0]:,.1f}, {s['spread_us'][1]:,.1f}] "
        f"over {s['rounds']} rounds (predicted {it.get('saving_us'):,.1f}{less}{in_step})")
    return {**rec, "status": "proven", **s, "kernels": kernels, "seconds": time.perf_counter() - t1}


# --------------------------------------------------------------------------- in fresh processes
# A setting torch reads once, before its first cuBLASLt handle (the workspace variable), cannot be switched in the
# live program: the script is started again in child processes (`gpu.prove_child`), the original and the variant
# alternating, and their steps compared as the live rounds compare blocks.

FRESH_KINDS = ("workspace",)   # advice proven in fresh processes, never in the live step
FRESH_BLAS = {"lt": "cublaslt"}  # the advice's path -> torch's BLAS preference the variant child sets
FRESH_ROUNDS = 5        # child pairs (original, variant) per item
FRESH_NOISE = 3         # original-against-original child pairs, once per proof (fewer than the live rounds: each
                        # child starts the program again)
FRESH_BLOCKS = 3        # timed blocks per child ...
FRESH_STEPS = 3         # ... of this many steps back to back
FRESH_WARMUP = 3        # untimed steps first: a fresh process's first steps make its handles, caches and graphs
FRESH_TIMEOUT_S = 600.0  # one child at most


def fresh_setting(item: dict) -> dict:
    """What the variant child of a fresh-process item runs with: ``blas`` (torch's BLAS preference) and ``env``
    (the variables set before torch starts), from the item's ``change`` (``{"path": "lt", "workspace_bytes": N}``:
    CUBLASLT_WORKSPACE_SIZE is N in KiB, as torch reads it, rounded up). Raises Unproven when the item does not say
    the size (a measurement whose paths do not record the workspace they were timed with) or the path."""
    change = item.get("change") or {}
    ws = change.get("workspace_bytes")
    if not isinstance(ws, int) or isinstance(ws, bool) or ws <= 0:
        raise Unproven("the item does not say the workspace size its GEMMs were timed with (the measurement's "
                       "paths do not record it): measure the run again (audit --measure --save)")
    blas = FRESH_BLAS.get(change.get("path"))
    if blas is None:
        raise Unproven(f"path {change.get('path')!r} has no torch switch")
    return {"blas": blas, "env": {prove_child.WORKSPACE_VAR: str(-(-ws // 1024))}}


PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fresh_env(base: dict, setting: dict | None) -> dict[str, str]:
    """A child's environment: `base` (this process's: the program as it runs) with this package first on
    PYTHONPATH (the child imports the same cublaslt_probe) and, for the variant, `setting`'s variables."""
    env = dict(base)
    env.update((setting or {}).get("env") or {})
    env["PYTHONPATH"] = PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def fresh_command(script: list[str], setting: dict | None, *, blocks: int = FRESH_BLOCKS, steps: int = FRESH_STEPS,
                  warmup: int = FRESH_WARMUP) -> list[str]:
    """A child's command line (`prove_child.command`): the variant's (`setting`) sets torch's BLAS preference
    before the script runs; the original's leaves it to the script."""
    return prove_child.command(script, blocks=blocks, steps=steps, warmup=warmup,
                               blas=(setting or {}).get("blas"))


def run_child(cmd: list[str], env: dict, timeout: float = FRESH_TIMEOUT_S) -> dict:
    """One child run: its JSON line (``ok``, ``blocks_us``, ``observed``) and ``wall_s``; a child that failed,
    timed out or printed no result gives ``ok`` False and ``why``: the last line of its stderr (the exception
    of a traceback)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0}
    res = None
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                res = json.loads(line)
            except ValueError:
                res = None
            break
    if rc == 0 and isinstance(res, dict) and res.get("ok") and isinstance(res.get("blocks_us"), list):
        return {**res, "wall_s": time.perf_counter() - t0}
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    why = lines[-1] if lines else (res or {}).get("error") or f"exit status {rc}, no output"
    return {"ok": False, "why": why, "wall_s": time.perf_counter() - t0}


def _steps(blocks: list[list[float]]) -> list[float]:
    return [x for b in blocks for x in b]


def fresh_summary(original: list[list[list[float]]], variant: list[list[list[float]]],
                  noise: list[tuple[list[list[float]], list[list[float]]]]) -> dict:
    """The statistics of fresh-process rounds, as `analysis.proof.summarize` gives a live item's: round i compares
    child ``original[i]``'s timed steps (its blocks, each a list of step µs) with child ``variant[i]``'s; the noise
    rounds are the original-against-original pairs' differences of medians. Adds ``measured`` (how)."""
    noise_rounds = [statistics.median(_steps(a)) - statistics.median(_steps(b)) for a, b in noise]
    s = summarize([_steps(b) for b in original], [_steps(b) for b in variant], noise_rounds)
    s["measured"] = (f"in fresh processes: {len(original)} rounds of child pairs (original and variant, the order "
                     f"alternating), noise from {len(noise)} original-against-original pairs")
    return s


def _fresh_pair(script, first, second, blocks, steps, warmup, timeout) -> tuple[dict, dict]:
    """Two children, `first` then `second` (each a setting, None for the original): their runs."""
    out = []
    for setting in (first, second):
        out.append(run_child(fresh_command(script, setting, blocks=blocks, steps=steps, warmup=warmup),
                             fresh_env(os.environ, setting), timeout))
        if not out[-1]["ok"]:
            break
    return out[0], (out[1] if len(out) > 1 else {"ok": False, "why": "not run"})


def _fresh_noise(script, pairs, blocks, steps, warmup, timeout) -> dict:
    """The original-against-original pairs: their blocks, the original's observed settings, or the failure."""
    got = []
    for _ in range(pairs):
        a, b = _fresh_pair(script, None, None, blocks, steps, warmup, timeout)
        if not (a["ok"] and b["ok"]):
            return {"ok": False, "why": f"the original program's child failed: {(a if not a['ok'] else b)['why']}"}
        got.append((a, b))
    return {"ok": True, "pairs": [(a["blocks_us"], b["blocks_us"]) for a, b in got],
            "observed": got[0][0].get("observed")}


def fresh_mismatch(setting: dict, observed: dict | None) -> str | None:
    """Why a variant child did not run with `setting` (its ``observed``: torch's BLAS preference after the steps,
    the workspace variable it started with), or None."""
    observed = observed or {}
    if observed.get("blas") != setting["blas"]:
        return (f"the variant's child ran on {observed.get('blas')!r}, not {setting['blas']!r} (the script sets "
                "torch's BLAS preference itself)")
    for var, value in setting["env"].items():
        if observed.get(var) != value:
            return f"the variant's child started with {var}={observed.get(var)!r}, not {value!r}"
    return None


def _prove_fresh(it: dict, rec: dict, script: list[str], setting: dict, noise: dict, rounds: int, head: str,
                 say, t1: float, blocks: int = FRESH_BLOCKS, steps: int = FRESH_STEPS, warmup: int = FRESH_WARMUP,
                 timeout: float = FRESH_TIMEOUT_S) -> dict:
    """A fresh-process item's record: `rounds` pairs of children (the original and the variant, the order
    alternating from round to round so that a drift of the GPU falls on both), compared with `noise`'s pairs
    (`_fresh_noise`, shared by the proof's fresh items)."""
    rec = {**rec, "setting": setting}
    if not noise["ok"]:
        say(f"{head}: failed (the original's child)")
        return {**rec, "status": "failed", "why": noise["why"]}
    orig, var, walls = [], [], []
    for r in range(rounds):
        first, second = (None, setting) if r % 2 == 0 else (setting, None)
        a, b = _fresh_pair(script, first, second, blocks, steps, warmup, timeout)
        o, v = (a, b) if first is None else (b, a)
        ran = (("original", a), ("variant", b)) if first is None else (("variant", a), ("original", b))
        bad = next(((w, c) for w, c in ran if not c["ok"]), None)        # the first to fail, in the order run
        if bad:
            say(f"{head}: failed (the {bad[0]}'s child)")
            return {**rec, "status": "failed", "why": f"the {bad[0]}'s child failed: {bad[1]['why']}"}
        wrong = fresh_mismatch(setting, v.get("observed"))
        if wrong:
            say(f"{head}: failed (the variant did not apply)")
            return {**rec, "status": "failed", "why": wrong, "observed": {"original": o.get("observed"),
                                                                         "variant": v.get("observed")}}
        orig.append(o["blocks_us"])
        var.append(v["blocks_us"])
        walls += [o["wall_s"], v["wall_s"]]
    s = fresh_summary(orig, var, noise["pairs"])
    say(f"{head}: {s['proven_us']:,.1f} µs/step [{s['spread_us'][0]:,.1f}, {s['spread_us'][1]:,.1f}] over "
        f"{s['rounds']} rounds of fresh processes (predicted {it.get('saving_us'):,.1f})")
    return {**rec, "status": "proven", **s,
            "observed": {"original": noise.get("observed"), "variant": v.get("observed")},
            "fresh": {"rounds": rounds, "noise_pairs": len(noise["pairs"]), "blocks": blocks, "steps": steps,
                      "warmup": warmup, "child_s": statistics.median(walls)},
            "seconds": time.perf_counter() - t1}


def prove(step, model, items: list[dict], *, optimizer=None, rounds: int = ROUNDS, steps: int = STEPS,
          warmup: int = WARMUP, progress=None, script: list[str] | None = None,
          fresh_rounds: int = FRESH_ROUNDS, fresh_noise: int = FRESH_NOISE) -> dict:
    """Proves each advice item in the program's own step (see the module doc). `script` (the program's script
    and its arguments, as `cublaslt-probe prove` runs it) lets the items that must precede torch's first
    cuBLASLt handle (`FRESH_KINDS`) be proven in fresh processes, `fresh_rounds` child pairs each against
    `fresh_noise` original-against-original pairs; without it they are unproven. Returns the proof (without the
    run's binding, which the caller adds): ``noise`` (the original-against-original rounds), ``items`` (one
    record per item with a predicted saving: ``status`` proven | unproven | failed, the statistics of
    `analysis.proof.summarize`, ``numerics``, ``why``; a live item proven, ``kernels``: the step's kernels with
    the change off and on, `analysis.proof.kernel_split`; a fresh-process item ``measured``, ``setting``,
    ``observed`` and ``fresh``), ``cost_s``, ``restored`` (the tensors that differ after restoring: empty)."""
    import torch
    say = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    state = _State(torch, model, optimizer)
    out_items = []
    try:
        for _ in range(warmup + 1):
            step()
        o1, o2 = _rounds(torch, step, lambda: None, lambda: None, rounds, steps, warmup)
        noise = [statistics.median(a) - statistics.median(b) for a, b in zip(o1, o2)]
        todo = [it for it in items if (it.get("saving_us") or 0) > 0]
        noise_children = None       # the original-against-original children, run once for the fresh items
        for n, it in enumerate(todo, 1):
            rec = {"what": it.get("what"), "kind": it.get("kind"), "module": it.get("module"),
                   "predicted_us": it.get("saving_us")}
            t1 = time.perf_counter()
            if it.get("kind") in FRESH_KINDS and script:
                try:
                    setting = fresh_setting(it)
                except Unproven as e:
                    out_items.append({**rec, "status": "unproven", "why": str(e)})
                    say(f"prove {n}/{len(todo)}: {it.get('what')}: unproven ({e})")
                    continue
                if noise_children is None:
                    noise_children = _fresh_noise(list(script), fresh_noise, FRESH_BLOCKS, FRESH_STEPS,
                                                  FRESH_WARMUP, FRESH_TIMEOUT_S)
                out_items.append(_prove_fresh(it, rec, list(script), setting, noise_children, fresh_rounds,
                                              f"prove {n}/{len(todo)}: {it.get('what')}", say, t1))
                continue
            try:
                ap = applier_for(torch, model, it)
            except Unproven as e:
                out_items.append({**rec, "status": "unproven", "why": str(e)})
                say(f"prove {n}/{len(todo)}: {it.get('what')}: unproven ({e})")
                continue
            try:
                out_items.append(_prove_item(torch, step, ap, it, rec, noise, rounds, steps, warmup, n, len(todo),
                                             say, t1))
            finally:
                getattr(ap, "close", lambda: None)()
    finally:
        torch.cuda.synchronize()
        state.restore()
    return {"noise": {"rounds_us": noise, "steps": steps, "warmup": warmup, "rounds": rounds},
            "items": out_items, "cost_s": time.perf_counter() - t0, "restored": state.same()}


def prove_run(run, step, model, measure, *, optimizer=None, out=None, rounds: int = ROUNDS, steps: int = STEPS,
              warmup: int = WARMUP, progress=None, script: list[str] | None = None,
              fresh_rounds: int = FRESH_ROUNDS) -> dict:
    """Proves the advice of a run in the program that made it: `run` is the run folder (`capture`'s), `measure`
    its saved measurement (a path, or the dict `audit --measure --save` writes), checked and bound to the run as
    `audit --from` does (another run's is refused). The advice is made as `audit` makes it, every item with a
    predicted saving is proven in `step` (`prove`; with `script`, the program's script and arguments, a workspace
    item in fresh processes of it), and the proof, bound to the run by its fingerprint, is written to `out`
    (default: ``proof.json`` in the run folder). Returns the proof."""
    import os

    import torch

    from cublaslt_probe.analysis.audit import advice, audit
    from cublaslt_probe.analysis.audit.measured import load_bound, run_fingerprint
    from cublaslt_probe.analysis.proof import write
    a = audit(run)
    meas, notes = load_bound(a, measure, str(run))
    items = advice(a.rows, meas, a.step_gpu_us, a.step_gpu_us * a.steps)
    proof = prove(step, model, items, optimizer=optimizer, rounds=rounds, steps=steps, warmup=warmup,
                  progress=progress, script=script, fresh_rounds=fresh_rounds)
    proof["fingerprint"] = run_fingerprint(a, str(run))
    proof["notes"] = notes
    proof["env"] = {"gpu": torch.cuda.get_device_name(), "torch_version": torch.__version__,
                    "cuda_runtime": torch.version.cuda}
    path = out or os.path.join(str(run), "proof.json")
    write(path, proof)
    proof["path"] = str(path)
    return proof
