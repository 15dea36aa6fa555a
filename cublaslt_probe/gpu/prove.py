"""Advice proven in the program's own step: each item applied to the live program, the step timed A/B.

`prove(step, model, items, ...)` takes the program's step (a zero-argument callable), its model and the audit's
advice items (`analysis.audit.advice`'s dicts). For each item it finds an applier (`applier_for`), checks the
applier's numerics on an input the module really saw, then runs rounds that alternate the original and the
variant (a warm-up step after each switch, each step between CUDA events on torch's current stream), and
restores the program. The original-against-original rounds, run once, give the noise floor. The model's
parameters and buffers, the optimizer's state when one is given, and the RNG states are saved before and put
back after, so the program continues from where it was, bit for bit. The statistics, the verdict and the file
live in `analysis.proof`.

Appliers (each reversible; `apply()` then `restore()` leaves the module as it was):
- `PadLinear`: an `nn.Linear`'s output features (n) or input features (k) padded with zeros to the advised size,
  the result sliced back (output) or the input padded with zeros per call (input, a copy the change costs): the
  forward and backward GEMMs run at the padded size, and the parameter's storage becomes the head rows (columns)
  of the padded buffer, so the optimizer's updates reach the padded weight and gradients reach the parameter.
- `BlasPath`: torch's BLAS switch (`torch.backends.cuda.preferred_blas_library`).
Everything else is *unproven* with the reason: token (m) padding is the program's input; a workspace size must
be set before torch's first cuBLASLt handle (a fresh process); a pin has no way into torch 2.11 (TunableOp takes
cuBLASLt candidates from torch 2.14); a grouped change restructures the experts layer.
"""
from __future__ import annotations

import copy
import fnmatch
import math
import statistics
import sys
import time

from cublaslt_probe.analysis.proof import summarize

TOLERANCE = {"torch.bfloat16": 2e-2, "torch.float16": 4e-3, "torch.float32": 2e-2}  # relative, max-abs over the
                                                                                    # output's max-abs
ROUNDS = 5          # alternating rounds per item (and of the noise floor)
STEPS = 2           # timed steps per block
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
        for name, m in self.mods:
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
            dim, old, new = self.dim, self.old, self.new

            def forward(x, m=m, big=big, bigb=bigb, dim=dim, old=old, new=new):
                return fn.apply(x, m.weight, m.bias, big, bigb, dim, old, new)
            m.forward = forward

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


def applier_for(torch, model, item: dict):
    """The applier of one advice item, or raises Unproven saying why it cannot be applied."""
    kind, change = item.get("kind"), item.get("change") or {}
    if kind == "pad":
        mods = _modules(model, item.get("module"))
        if not mods:
            raise Unproven(f"no module of the model is named {item.get('module')!r}")
        lin = [(n, m) for n, m in mods if isinstance(m, torch.nn.Linear)]
        if len(lin) != len(mods):
            raise Unproven(f"{item.get('module')}: not an nn.Linear (only a linear's features can be padded here)")
        old, new = change.get("from"), change.get("to")
        if not (isinstance(old, int) and isinstance(new, int) and new > old):
            raise Unproven("the item does not say which value to pad to which")
        outs = {m.out_features for _, m in lin}
        ins = {m.in_features for _, m in lin}
        if outs == {old} and old not in ins:
            return PadLinear(torch, lin, "out", old, new)
        if ins == {old} and old not in outs:
            return PadLinear(torch, lin, "in", old, new)
        if old in outs and old in ins:
            raise Unproven(f"{old} is both the input and the output features of {item.get('module')}: "
                           "which to pad is ambiguous")
        raise Unproven(f"{old} is the number of tokens (m): the program's input, which the tool cannot pad")
    if kind == "path":
        lib = PATHS.get(change.get("path"))
        if lib is None:
            raise Unproven(f"path {change.get('path')!r} has no torch switch")
        return BlasPath(torch, lib)
    if kind == "workspace":
        raise Unproven("a workspace size takes effect before torch's first cuBLASLt handle: run the program in a "
                       "fresh process with the variable set and compare")
    if kind == "pin":
        raise Unproven("torch 2.11 cannot pin a cuBLASLt algo in a program (TunableOp takes cuBLASLt candidates "
                       "from torch 2.14); replay the pinned line to time it alone")
    if kind == "grouped":
        raise Unproven("the change restructures the experts layer; no applier for it in this program")
    raise Unproven(f"no applier for advice of kind {kind!r}")


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


def _time_block(torch, step, n: int) -> list[float]:
    """n steps, each between two CUDA events on the current stream: their GPU spans in µs."""
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return out


def _rounds(torch, step, on, off, rounds: int, steps: int, warmup: int) -> tuple[list, list]:
    """Alternating rounds: original block, then variant block (switched on, warmed up), switched off again."""
    orig, var = [], []
    for _ in range(rounds):
        for _ in range(warmup):
            step()
        orig.append(_time_block(torch, step, steps))
        on()
        try:
            for _ in range(warmup):
                step()
            var.append(_time_block(torch, step, steps))
        finally:
            off()
    return orig, var


def _numerics(torch, applier, sample) -> dict:
    """The applied module's output against the original on an input it saw: max |Δ| over max |y|, within the
    dtype's tolerance (`TOLERANCE`), and the shapes equal."""
    if not isinstance(applier, PadLinear) or sample is None:
        return {"checked": False}
    m, x = sample
    with torch.no_grad():
        y0 = m(x)
        applier.apply()
        try:
            y1 = m(x)
        finally:
            applier.restore()
    if y0.shape != y1.shape:
        return {"checked": True, "ok": False, "why": f"shape {tuple(y1.shape)} instead of {tuple(y0.shape)}"}
    err = float((y1.float() - y0.float()).abs().max()) / max(float(y0.float().abs().max()), 1e-30)
    tol = TOLERANCE.get(str(y0.dtype), 2e-2)
    return {"checked": True, "ok": bool(math.isfinite(err) and err <= tol), "rel_err": err, "tolerance": tol}


def _sample_input(torch, step, mods: list):
    """One input the first of `mods` really saw: a forward pre-hook during one step of the program."""
    if not mods:
        return None
    m = mods[0][1]
    seen = []
    h = m.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()) if not seen else None)
    try:
        step()
    finally:
        h.remove()
    return (m, seen[0]) if seen else None


def prove(step, model, items: list[dict], *, optimizer=None, rounds: int = ROUNDS, steps: int = STEPS,
          warmup: int = WARMUP, progress=None) -> dict:
    """Proves each advice item in the program's own step (see the module doc). Returns the proof (without the
    run's binding, which the caller adds): ``noise`` (the original-against-original rounds), ``items`` (one
    record per item with a predicted saving: ``status`` proven | unproven | failed, the statistics of
    `analysis.proof.summarize`, ``numerics``, ``why``), ``cost_s``, ``restored`` (the tensors that differ
    after restoring: empty)."""
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
        for n, it in enumerate(todo, 1):
            rec = {"what": it.get("what"), "kind": it.get("kind"), "module": it.get("module"),
                   "predicted_us": it.get("saving_us")}
            t1 = time.perf_counter()
            try:
                ap = applier_for(torch, model, it)
            except Unproven as e:
                out_items.append({**rec, "status": "unproven", "why": str(e)})
                say(f"prove {n}/{len(todo)}: {it.get('what')}: unproven ({e})")
                continue
            mods = getattr(ap, "mods", [])
            rec["numerics"] = _numerics(torch, ap, _sample_input(torch, step, mods))
            if rec["numerics"].get("checked") and not rec["numerics"]["ok"]:
                out_items.append({**rec, "status": "failed", "why": "the applied module's output differs: "
                                  + rec["numerics"].get("why", f"relative error {rec['numerics']['rel_err']:.3g}")})
                say(f"prove {n}/{len(todo)}: {it.get('what')}: failed (numerics)")
                continue
            try:
                a, b = _rounds(torch, step, ap.apply, ap.restore, rounds, steps, warmup)
            except Exception as e:   # the program's own error under the variant: the item failed, the run goes on
                out_items.append({**rec, "status": "failed", "why": f"the step failed under the change: "
                                  f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
                say(f"prove {n}/{len(todo)}: {it.get('what')}: failed ({e.__class__.__name__})")
                continue
            s = summarize(a, b, noise)
            out_items.append({**rec, "status": "proven", **s, "seconds": time.perf_counter() - t1})
            say(f"prove {n}/{len(todo)}: {it.get('what')}: {s['proven_us']:,.1f} µs/step "
                f"[{s['spread_us'][0]:,.1f}, {s['spread_us'][1]:,.1f}] (predicted {it.get('saving_us'):,.1f})")
    finally:
        torch.cuda.synchronize()
        state.restore()
    return {"noise": {"rounds_us": noise, "steps": steps, "warmup": warmup, "rounds": rounds},
            "items": out_items, "cost_s": time.perf_counter() - t0, "restored": state.same()}
