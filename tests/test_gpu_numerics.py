"""GPU: the numerics check (`gpu.numerics`) passes a real kernel's correct output and catches a wrong one.

The wrong output is made by a real cuBLASLt kernel run on altered operands (the last eight K elements of A
zeroed: what dropping a K tail does), compared with the reference of the unaltered operands."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def env():
    import torch

    from cublaslt_probe.gpu import lt
    return torch, lt.LtLibrary()


@pytest.mark.parametrize("dtype,trans_a,trans_b", [("bf16", "T", "N"), ("fp16", "N", "T"), ("bf16", "N", "N")])
def test_numerics_catches_a_dropped_k_tail(env, dtype, trans_a, trans_b):
    torch, lib = env
    from cublaslt_probe.gpu import lt, numerics
    from cublaslt_probe.gpu.operands import LtGemm
    p = lt.Problem(4096, 16, 4096, dtype=dtype, trans_a=trans_a, trans_b=trans_b)
    with LtGemm(torch, lib, p) as g:
        algo = g.heuristic(1)[0].algo
        split = lib.read_algo_config(algo)["split_k"] or 1
        ref, absprod = numerics.reference(torch, p, g.A, g.B)
        good = numerics.run_config(torch, g, algo, ref, absprod, split_k=split)
        assert good["numerics_ok"], good
        assert good["error_ratio"] < 0.5
        a, _ = numerics.op_views(p, g.A, g.B)   # a view: zeroing it alters the operand the kernel reads
        a[:, :, p.k - 8:] = 0
        bad = numerics.run_config(torch, g, algo, ref, absprod, split_k=split)
        assert not bad["numerics_ok"], bad
        assert bad["bad_elements"] > 0


def test_numerics_catches_an_unwritten_output(env):
    torch, lib = env
    from cublaslt_probe.gpu import lt, numerics
    from cublaslt_probe.gpu.operands import LtGemm
    p = lt.Problem(4096, 64, 1024, dtype="bf16", trans_a="T")
    with LtGemm(torch, lib, p) as g:
        ref, absprod = numerics.reference(torch, p, g.A, g.B)
        g.D.fill_(float("nan"))
        g.call(g.heuristic(1)[0].algo)()
        torch.cuda.synchronize()
        g.D[0, 3, 5] = float("nan")   # one element the kernel "skipped"
        r = numerics.check(torch, p, g.D, ref, absprod)
        assert not r["numerics_ok"] and r["error_ratio"] == float("inf")
