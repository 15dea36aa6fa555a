"""GPU tests of proving advice in the program's own step (`gpu.prove`): the padded-linear applier computes the
original's answer and restores the module, the proof leaves parameters and optimizer state bit for bit as they
were, an applier that forgets to slice is caught by its numerics, and what cannot be applied is unproven with a
reason. Skipped with a reason without a GPU."""
import copy

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the device machine: pytest -m gpu)")
    return torch


def _program(torch, train: bool):
    """A two-linear model whose first linear has an odd number of output features (4095), bf16, and its step:
    a training step with AdamW, or an inference forward."""
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.odd = torch.nn.Linear(2048, 4095)
            self.even = torch.nn.Linear(4095, 2048, bias=False)

        def forward(self, x):
            return self.even(torch.relu(self.odd(x)))

    model = Model().cuda().to(torch.bfloat16)
    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if train else None

    def step():
        if train:
            model(x).float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                model(x)
    return model, opt, x, step


PAD_OUT = {"kind": "pad", "what": "pad 4095 → 4096 (a multiple of 8) in odd", "module": "odd", "saving_us": 5.0,
           "change": {"from": 4095, "to": 4096}}
PAD_IN = {"kind": "pad", "what": "pad 4095 → 4096 (a multiple of 8) in even", "module": "even", "saving_us": 5.0,
          "change": {"from": 4095, "to": 4096}}


def _output_and_grads(model, x):
    """One forward and backward of `model` on `x` (loss: the output's mean square): the output and every
    parameter's gradient, copied."""
    model.zero_grad(set_to_none=True)
    y = model(x)
    y.float().pow(2).mean().backward()
    return y.detach().clone(), [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("item", [PAD_OUT, PAD_IN], ids=["out", "in"])
def test_a_padded_linear_computes_the_original_answer_forward_and_backward_and_restores_the_module(torch, item):
    from cublaslt_probe.gpu.prove import PadLinear, applier_for
    model, _, x, _ = _program(torch, train=True)
    ap = applier_for(torch, model, item)
    assert isinstance(ap, PadLinear) and ap.dim == ("out" if item is PAD_OUT else "in")
    m = model.get_submodule(item["module"])
    w_ptr, w_shape = m.weight.data_ptr(), tuple(m.weight.shape)

    y0, g0 = _output_and_grads(model, x)
    ap.apply()
    assert tuple(m.weight.shape) == w_shape and m.weight.data_ptr() != w_ptr   # inside the padded buffer
    y1, g1 = _output_and_grads(model, x)
    ap.restore()
    assert m.weight.data_ptr() == w_ptr and "forward" not in m.__dict__
    assert y1.shape == y0.shape
    assert float((y1.float() - y0.float()).abs().max()) <= 2e-2 * float(y0.float().abs().max())
    for a, b in zip(g0, g1):
        assert a.shape == b.shape
        assert float((a.float() - b.float()).abs().max()) <= 5e-2 * float(a.float().abs().max()) + 1e-6


def test_a_hidden_width_is_padded_on_both_sides_and_computes_the_original_answer(torch):
    """A pad item whose module pattern names both linears around a hidden width of 4095 (as `*` names a
    Sequential's children): the first linear's output and the second's input are padded together (`PadWidth`),
    the activation between them matched and left alone; the answer and gradients are the original's."""
    from cublaslt_probe.gpu.prove import PadWidth, Unproven, applier_for
    model, _, x, _ = _program(torch, train=True)
    ap = applier_for(torch, model, {**PAD_OUT, "module": "*"})
    assert isinstance(ap, PadWidth) and [(p.dim, [n for n, _ in p.mods]) for p in ap.parts] == [
        ("out", ["odd"]), ("in", ["even"])]
    ptrs = [p.data_ptr() for p in model.parameters()]

    y0, g0 = _output_and_grads(model, x)
    ap.apply()
    assert model.odd.forward is not None and "forward" in model.even.__dict__
    y1, g1 = _output_and_grads(model, x)
    ap.restore()
    assert [p.data_ptr() for p in model.parameters()] == ptrs and "forward" not in model.odd.__dict__
    assert float((y1.float() - y0.float()).abs().max()) <= 2e-2 * float(y0.float().abs().max())
    for a, b in zip(g0, g1):
        assert float((a.float() - b.float()).abs().max()) <= 5e-2 * float(a.float().abs().max()) + 1e-6
    with pytest.raises(Unproven, match="number of tokens"):
        applier_for(torch, model, {**PAD_OUT, "module": "*", "change": {"from": 1024, "to": 1032}})


def test_proving_leaves_the_program_bit_for_bit_as_it_was(torch):
    from cublaslt_probe.gpu.prove import prove
    model, opt, x, step = _program(torch, train=True)
    for _ in range(2):
        step()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt_before = {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(opt.state.values())}
    with torch.no_grad():
        out_before = model(x).clone()
    items = [PAD_OUT, PAD_IN, {"kind": "pin", "what": "pin candidate #3 for odd", "module": "odd", "saving_us": 2.0},
             {"kind": "pad", "what": "pad 1024 → 1032 in odd", "module": "odd", "saving_us": 1.0,
              "change": {"from": 1024, "to": 1032}}]
    proof = prove(step, model, items, optimizer=opt, rounds=3, steps=2, warmup=1, progress=lambda s: None)
    assert proof["restored"] == []
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    for i, s in enumerate(opt.state.values()):
        for k, v in s.items():
            assert torch.equal(v, opt_before[i][k]), (i, k)
    with torch.no_grad():
        assert torch.equal(model(x), out_before)
    by = {r["what"]: r for r in proof["items"]}
    assert by[PAD_OUT["what"]]["status"] == "proven" and by[PAD_OUT["what"]]["numerics"]["ok"]
    assert by[PAD_IN["what"]]["status"] == "proven" and by[PAD_IN["what"]]["numerics"]["ok"]
    assert by["pin candidate #3 for odd"]["status"] == "unproven" and "algo config" in by["pin candidate #3 for odd"][
        "why"]                                  # a pin item without its candidate's config cannot be applied
    assert by["pad 1024 → 1032 in odd"]["status"] == "unproven" and "tokens" in by["pad 1024 → 1032 in odd"]["why"]
    r = by[PAD_OUT["what"]]
    assert r["rounds"] in (3, 6, 9) and r["original_step_us"] > 0 and r["variant_step_us"] > 0
    assert len(proof["noise"]["rounds_us"]) == 3
    # the padded linears' own copies, timed on the item's sizes: a training step has both (forward and gradient)
    for what in (PAD_OUT["what"], PAD_IN["what"]):
        cost = by[what]["applier_cost"]
        assert cost["tokens"] == 1024 and cost["calls"] == 1 and len(cost["parts"]) == 2, cost
        assert all(v > 0 for v in cost["parts"].values()) and cost["us"] == sum(cost["parts"].values())


def test_an_applier_that_forgets_to_slice_is_caught_by_its_numerics(torch):
    from cublaslt_probe.gpu import prove as P
    model, _, _, step = _program(torch, train=False)

    class Unsliced(P.PadLinear):
        def apply(self):
            for _, m in self.mods:
                w = m.weight
                big = torch.zeros((self.new, w.shape[1]), dtype=w.dtype, device=w.device)
                big[: self.old].copy_(w.data)
                self._saved.append((m, w.data, None))
                m.forward = lambda x, big=big: torch.nn.functional.linear(x, big)   # not sliced back

        def restore(self):
            for m, _, _ in self._saved:
                del m.forward
            self._saved = []

    ap = Unsliced(torch, [("odd", model.odd)], "out", 4095, 4096)
    res = P._numerics(torch, ap, P._sample_input(torch, lambda: model.odd(torch.randn(8, 2048, device="cuda",
                                                                                    dtype=torch.bfloat16)),
                                                  [("odd", model.odd)]))
    assert res["checked"] and res["ok"] is False and "shape" in res["why"]


def _candidates(torch, lin, tokens: int, n: int = 8) -> list[dict]:
    """cuBLASLt's heuristic candidates for the linear's forward problem, with their configs, asked through the
    library torch loaded (what `candidates` and `audit --measure` record)."""
    from cublaslt_probe.gpu import lt
    lib = lt.LtLibrary()
    p = lt.Problem(m=lin.out_features, n=tokens, k=lin.in_features, dtype="bf16", trans_a="T", trans_b="N",
                   bias=lin.bias is not None)
    with lt.LtMatmul(lib, p) as mm:
        return [{**lib.read_algo_config(r.algo), "workspace_bytes": int(r.workspaceSize)} for r in mm.heuristic(n)]


def _kernels(torch, fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _pinned_forward(torch, lin, algo: dict, x) -> None:
    """One forward of a copy of `lin` with `algo` pinned on it, on `x`."""
    from cublaslt_probe.gpu.pin import pin_linear
    twin = copy.deepcopy(lin)
    pin = pin_linear(twin, algo, tokens=x.shape[0])
    try:
        with torch.no_grad():
            twin(x)
    finally:
        pin.remove()


def test_a_pinned_linear_launches_the_candidates_kernel_eagerly_and_in_a_cuda_graph(torch):
    from cublaslt_probe.gpu.pin import pin_linear
    torch.manual_seed(0)
    lin = torch.nn.Linear(4096, 4096).cuda().to(torch.bfloat16)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = lin(x)
    torch_kernels = _kernels(torch, lambda: lin(x))
    cands = _candidates(torch, lin, 16)
    assert len(cands) >= 2
    seen = {}
    for i, c in enumerate(cands[:4]):
        pin = pin_linear(lin, c, tokens=16)
        try:
            with torch.no_grad():
                y = lin(x)
                names = _kernels(torch, lambda: lin(x))
            assert float((y.float() - ref.float()).abs().max()) <= 2e-2 * float(ref.float().abs().max()), i
            seen[i] = [n for n in names if "gemm" in n.lower() or n.startswith("nvjet") or "Kernel" in n]
        finally:
            pin.remove()
        assert "forward" not in lin.__dict__
    # candidate #0 is the heuristic's own pick: the kernel torch's call launches
    assert seen[0][0] in torch_kernels, (seen[0], torch_kernels)
    assert len({tuple(v) for v in seen.values()}) >= 2, seen     # other candidates launch other kernels
    # inside a CUDA graph: the replay launches the pinned candidate's kernel
    pin = pin_linear(lin, cands[1], tokens=16)
    try:
        static = x.clone()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            lin(static)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g), torch.no_grad():
            out = lin(static)
        names = _kernels(torch, g.replay)
        assert seen[1][0] in names, (seen[1], names)
        assert float((out.float() - ref.float()).abs().max()) <= 2e-2 * float(ref.float().abs().max())
    finally:
        pin.remove()


def test_a_pin_is_proven_in_a_training_step_with_its_backward_left_to_torch(torch):
    """The pin applier (`prove`'s route for a pin item) on a training step: the step runs, the parameters are
    put back, and the step's kernels show the candidate's kernel in place of torch's. (The pinned forward's
    host overhead is a benchmark: benchmarks/bench_pin_overhead.py.)"""
    from cublaslt_probe.gpu.prove import prove
    model, opt, x, step = _program(torch, train=True)
    lin = model.odd

    def gemm(names):          # the call's first kernel that is not a copy or a memset: its GEMM
        return next(n for n in names if not n.startswith(("Memcpy", "Memset")))
    with torch.no_grad():
        own = gemm(_kernels(torch, lambda: lin(x)))
    # the first candidate after torch's own pick whose kernel is not torch's (its name tells them apart)
    for algo in _candidates(torch, lin, 1024)[1:]:
        pinned = gemm(_kernels(torch, lambda a=algo: _pinned_forward(torch, lin, a, x)))
        if pinned != own:
            break
    item = {"kind": "pin", "what": "pin candidate #1 for odd", "module": "odd", "saving_us": 3.0,
            "change": {"algo": algo, "key": {"m": 1024, "n": 4095, "k": 2048, "batch": 1}, "pass": "fwd"}}
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    proof = prove(step, model, [item], optimizer=opt, rounds=3, progress=lambda s: None)
    assert proof["items"][0]["status"] == "proven", proof["items"][0]
    assert proof["restored"] == [] and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # the step's kernels with the pin off and on: the variant launches the candidate's kernel once more per step
    # (the forward; other GEMMs of the step may use it too) and torch's own forward kernel once less
    k = proof["items"][0]["kernels"]
    assert k["steps"] == 3 and k["original_us"] > 0 and k["variant_us"] > 0, k
    by = {c["name"]: c for c in k["changed"]}
    said = [(c["name"][:60], c["original_calls"], c["variant_calls"]) for c in k["changed"]]
    assert pinned in by and by[pinned]["variant_calls"] - by[pinned]["original_calls"] == 1, (pinned, said)
    assert own in by and by[own]["original_calls"] - by[own]["variant_calls"] == 1, (own, said)


def test_a_pinned_linear_runs_whole_under_torch_compile_and_reduce_overhead(torch):
    """The pin is one custom op to torch.compile: no graph break (fullgraph), the candidate's kernel launches in
    the compiled forward and in the reduce-overhead replay, and the compiled training step's backward is
    torch's."""
    import torch._dynamo

    from cublaslt_probe.gpu.pin import pin_linear
    torch.manual_seed(0)
    lin = torch.nn.Linear(4096, 4096).cuda().to(torch.bfloat16)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = lin(x)
    cands = _candidates(torch, lin, 16)
    pin = pin_linear(lin, cands[1], tokens=16)
    try:
        with torch.no_grad():
            eager = _kernels(torch, lambda: lin(x))
        want = [n for n in eager if "gemm" in n.lower() or n.startswith("nvjet") or "Kernel" in n][0]
        for mode in ("default", "reduce-overhead"):
            torch._dynamo.reset()
            f = torch.compile(lambda t: lin(t), mode=mode, fullgraph=True)
            with torch.no_grad():
                for _ in range(3):
                    out = f(x)
                names = _kernels(torch, lambda f=f: f(x))
            assert want in names, (mode, want, names)
            assert float((out.float() - ref.float()).abs().max()) <= 2e-2 * float(ref.float().abs().max()), mode
        torch._dynamo.reset()
        xg = x.clone().requires_grad_(True)
        g = torch.compile(lambda t: lin(t).float().square().sum(), fullgraph=True)
        g(xg).backward()
        xr = x.clone().requires_grad_(True)
        pin.remove()
        (lin(xr).float().square().sum()).backward()
        assert torch.allclose(xg.grad.float(), xr.grad.float(), rtol=5e-2, atol=5e-2)
    finally:
        pin.remove()
        torch._dynamo.reset()


def test_the_balanced_routing_what_if_balances_without_reading_the_gpu_after_its_first_call(torch):
    """The router hook replaces the top-k indices by the balanced assignment and the per-expert counts by
    theirs; after the first call it never synchronises with the GPU (a sync per layer would time the hook)."""
    from cublaslt_probe.gpu.prove import BalancedRouting
    E, T, k = 8, 37, 2

    class Router(torch.nn.Module):
        def forward(self, x):
            scores, idx = torch.topk(x, k, dim=-1)
            ones = torch.ones(T * k, dtype=torch.long, device=x.device)
            return scores, idx, torch.zeros(E, dtype=torch.long, device=x.device).scatter_add_(0, idx.flatten(), ones)
    r = Router()
    x = torch.randn(T, E, device="cuda")
    ap = BalancedRouting(torch, [r], E)
    ap.apply()
    try:
        r(x)
        torch.cuda.set_sync_debug_mode("error")
        try:
            scores, idx, counts = r(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    finally:
        ap.restore()
    want = torch.arange(T * k, device="cuda") % E
    assert torch.equal(idx.flatten(), want)
    assert torch.equal(counts, torch.bincount(want, minlength=E)) and scores.shape == (T, k)
    _, idx0, _ = r(x)
    assert not torch.equal(idx0.flatten(), want)                 # restored: the router's own choice again


PROGRAM = '''
import torch

torch.manual_seed(0)
with torch.device("cuda"):
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4095), torch.nn.ReLU(),
                                torch.nn.Linear(4095, 2048, bias=False)).to(torch.bfloat16)
x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)


def step():
    model(x).float().pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
'''


def test_the_prove_command_proves_a_scripts_advice_and_audit_shows_it(torch, tmp_path):
    """The user's route: a run captured from a script's program, its measurement saved by `audit --measure`,
    then `cublaslt-probe prove RUN --from M -- SCRIPT.py` (the script loaded, not run as __main__) writes the
    proof, and `audit --proof` shows the padding proven beside its prediction."""
    import runpy

    from click.testing import CliRunner

    import cublaslt_probe
    from cublaslt_probe.cli import main
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    ns = runpy.run_path(str(script))
    for _ in range(3):
        ns["step"]()
    run = tmp_path / "run"
    with cublaslt_probe.capture(run, model=ns["model"]) as cap:
        for _ in range(2):
            with cap.step():
                ns["step"]()
    meas, proof = tmp_path / "m.json", tmp_path / "p.json"
    r = CliRunner().invoke(main, ["audit", str(run), "--measure", "--top-measure", "4", "--save", str(meas)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["prove", str(run), "--from", str(meas), "-o", str(proof), "--rounds", "3",
                                  "--", str(script)])
    assert r.exit_code == 0, r.output
    assert proof.exists() and "prove 1/" in r.output
    r = CliRunner().invoke(main, ["audit", str(run), "--from", str(meas), "--proof", str(proof)])
    assert r.exit_code == 0, r.output
    import re
    lines = r.output.splitlines()
    at = [i for i, ln in enumerate(lines) if "4095 → 4096" in ln]
    assert at, r.output
    said = " ".join(lines[i] + " " + (lines[i + 1] if i + 1 < len(lines) else "") for i in at)
    assert re.search(r"(?<!un)proven ", said), said      # proven (saves, within noise or slower), not unproven


WORKSPACE = {"kind": "workspace", "saving_us": 5.0, "change": {"path": "lt", "workspace_bytes": 32 << 20},
             "what": "run on cuBLASLt with a 32 MiB workspace (preferred_blas_library('cublaslt') and "
                     "CUBLASLT_WORKSPACE_SIZE=32768)"}


def test_a_workspace_is_proven_in_fresh_processes_that_really_ran_with_it(torch, tmp_path, monkeypatch):
    """A workspace item cannot be switched in the live step: given the script, `prove` starts it again in child
    processes, the variant's with torch's BLAS preference set to cuBLASLt before the script and
    CUBLASLT_WORKSPACE_SIZE=32768 (KiB), the original's with neither; every variant child reports that it ran
    with them, and the item is proven over the rounds asked for, with a noise floor from the original's pairs,
    in a record a proof file accepts. Without the script the item is unproven, naming the command."""
    import json
    import runpy

    from cublaslt_probe.analysis import proof as P
    from cublaslt_probe.gpu.prove import prove
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    ns = runpy.run_path(str(script), run_name="__cublaslt_probe_prove__")
    said = []
    out = prove(ns["step"], ns["model"], [WORKSPACE], optimizer=ns["optimizer"], rounds=3,
                script=[str(script), "--unused"], fresh_rounds=2, fresh_noise=1, progress=said.append)
    (rec,) = out["items"]
    assert rec["status"] == "proven", rec
    assert rec["rounds"] == 2 and rec["noise_us"] is not None and rec["measured"].startswith("in fresh processes")
    assert rec["fresh"]["noise_pairs"] == 1
    assert rec["observed"]["variant"]["blas"] == "cublaslt"
    assert rec["observed"]["variant"]["CUBLASLT_WORKSPACE_SIZE"] == "32768"
    assert rec["observed"]["original"]["CUBLASLT_WORKSPACE_SIZE"] is None
    assert rec["setting"] == {"blas": "cublaslt", "env": {"CUBLASLT_WORKSPACE_SIZE": "32768"}}
    assert rec["original_step_us"] > 0 and rec["variant_step_us"] > 0 and out["restored"] == []
    assert any(s.startswith("prove 1/1: ") and "fresh processes" in s for s in said), said
    path = tmp_path / "proof.json"
    P.write(path, json.loads(json.dumps(out)))
    proof, notes = P.load(path)
    assert notes == [] and proof.items[0].status == "proven"
    out = prove(ns["step"], ns["model"], [WORKSPACE], rounds=3, progress=said.append)
    (rec,) = out["items"]
    assert rec["status"] == "unproven" and "cublaslt-probe prove RUN --from M -- SCRIPT.py" in rec["why"]
