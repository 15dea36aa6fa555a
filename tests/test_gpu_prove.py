"""GPU tests of proving advice in the program's own step (`gpu.prove`): the padded-linear applier computes the
original's answer and restores the module, the proof leaves parameters and optimizer state bit for bit as they
were, an applier that forgets to slice is caught by its numerics, and what cannot be applied is unproven with a
reason. Skipped with a reason without a GPU."""
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


@pytest.mark.parametrize("item", [PAD_OUT, PAD_IN], ids=["out", "in"])
def test_a_padded_linear_computes_the_original_answer_forward_and_backward_and_restores_the_module(torch, item):
    from cublaslt_probe.gpu.prove import PadLinear, applier_for
    model, _, x, _ = _program(torch, train=True)
    ap = applier_for(torch, model, item)
    assert isinstance(ap, PadLinear) and ap.dim == ("out" if item is PAD_OUT else "in")
    m = model.get_submodule(item["module"])
    w_ptr, w_shape = m.weight.data_ptr(), tuple(m.weight.shape)

    def run():
        model.zero_grad(set_to_none=True)
        y = model(x)
        y.float().pow(2).mean().backward()
        return y.detach().clone(), [p.grad.detach().clone() for p in model.parameters()]
    y0, g0 = run()
    ap.apply()
    assert tuple(m.weight.shape) == w_shape and m.weight.data_ptr() != w_ptr   # inside the padded buffer
    y1, g1 = run()
    ap.restore()
    assert m.weight.data_ptr() == w_ptr and "forward" not in m.__dict__
    assert y1.shape == y0.shape
    assert float((y1.float() - y0.float()).abs().max()) <= 2e-2 * float(y0.float().abs().max())
    for a, b in zip(g0, g1):
        assert a.shape == b.shape
        assert float((a.float() - b.float()).abs().max()) <= 5e-2 * float(a.float().abs().max()) + 1e-6


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
    assert by["pin candidate #3 for odd"]["status"] == "unproven" and "2.14" in by["pin candidate #3 for odd"]["why"]
    assert by["pad 1024 → 1032 in odd"]["status"] == "unproven" and "tokens" in by["pad 1024 → 1032 in odd"]["why"]
    r = by[PAD_OUT["what"]]
    assert r["rounds"] == 3 and r["original_step_us"] > 0 and r["variant_step_us"] > 0
    assert len(proof["noise"]["rounds_us"]) == 3


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
