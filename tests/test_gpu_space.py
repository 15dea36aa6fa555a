"""GPU: the whole algo space (`gpu.space`): the heuristic's pick is among the enumerated configs, a forced config
launches the kernel its config names, a search prunes, checks numerics and never crowns a wrong config."""
import random

import pytest

from cublaslt_probe.analysis import space as sm
from cublaslt_probe.analysis.evidence import main_kernel
from cublaslt_probe.cases import Case
from cublaslt_probe.names import decode

pytestmark = pytest.mark.gpu

DECODE = Case("lt", "mm", "bf16", "NT", 16, 4096, 4096)   # F.linear, 16 tokens: cuBLAS picks algo 66, split-K 2


@pytest.fixture(scope="module")
def probe():
    from cublaslt_probe.gpu.probe import Probe
    return Probe(pipeline=False)


@pytest.fixture(scope="module")
def decode_space(probe):
    from cublaslt_probe.gpu import space
    from cublaslt_probe.gpu.operands import CUBLAS_WORKSPACE, lt_problem
    p = lt_problem(DECODE, CUBLAS_WORKSPACE)
    with probe.lt_gemm(p) as g:
        sig = space.signature_of(probe, g, p)
    return p, sig


def _kernels(probe, fns):
    for f in fns:
        f()
    return [main_kernel([n for n, _ in ks]) for ks in probe.profile(fns)]


def _pair(name):
    parts = name.split("x")
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 and all(x.isdigit() for x in parts[:2]) else None


def test_the_heuristic_pick_is_among_the_enumerated_configs(probe, decode_space):
    from cublaslt_probe.gpu import space
    p, sig = decode_space
    assert sig.stats["by_algo"][66]["enumerated"] == "full" and not sig.stats["by_algo"][66]["stopped_by_budget"]
    bases = set(sig.bases)
    with probe.lt_gemm(p) as g:
        res = g.heuristic(8)
        checked = 0
        for rank, r in enumerate(res):
            cfg = probe.lib.read_algo_config(r.algo)
            if rank and cfg["algo_id"] != 66:   # the pick, and every candidate of the fully enumerated algo
                continue
            base = (cfg["algo_id"], cfg["tile_enum"], cfg["stages_enum"], cfg["cluster_enum"], cfg["custom_option"],
                    cfg["cta_swizzling"])
            assert base in bases, cfg
            forced = space.forced_algo(probe.lib, p, base, cfg["split_k"] or 1, cfg["reduction_scheme_enum"])
            heuristic_kernel, forced_kernel = _kernels(probe, [g.call(r.algo), g.call(forced)])
            assert heuristic_kernel and heuristic_kernel == forced_kernel, (rank, cfg)
            checked += 1
    assert checked >= 2


def test_forced_configs_launch_the_kernel_their_config_names(probe, decode_space):
    from cublaslt_probe.gpu import lt, space
    p, sig = decode_space
    lib = probe.lib
    named = [b for b in sig.bases if b[0] == 66 and _pair(lib.enums.name("tile", b[1]))
             and _pair(lib.enums.name("cluster", b[3]))]
    sample = random.Random(1).sample(named, 48)
    with probe.lt_gemm(p) as g:
        algos, cfgs = [], []
        for b in sample:
            for split in (1, 3):
                a = space.forced_algo(lib, p, b, split)
                if a is not None and lt.algo_check(g.mm, a)[0] == 0:
                    algos.append(a)
                    cfgs.append((b, split))
        names = _kernels(probe, [g.call(a) for a in algos])
    assert len(names) >= 60 and any(s > 1 for _, s in cfgs)
    wrong = []
    for (b, split), name in zip(cfgs, names):
        kn = decode(name)
        want = (*_pair(lib.enums.name("tile", b[1])), *_pair(lib.enums.name("cluster", b[3])), split > 1)
        got = (kn.tile_m, kn.tile_n, kn.cluster_m, kn.cluster_n, bool(kn.split_k))
        if kn.family != "nvjet" or got != want:
            wrong.append((space._cfg(lib, b, split), name))
    assert not wrong, f"{len(wrong)} of {len(names)} forced configs launched another kernel: {wrong[:8]}"


def test_a_search_prunes_and_checks_every_config_it_times(probe, decode_space):
    from cublaslt_probe.gpu import space
    rec = space.search(probe, DECODE, budget_s=1.5)
    cnt = rec["counts"]
    assert cnt["timed"] > 100 and cnt["pruned"] > 0 and cnt["kernels"] > 1000
    assert rec["pick_in_space"] is True
    assert rec["pick"]["numerics_ok"] is True and rec["pick"]["rank"] == 0
    for r in rec["leaders"]:
        assert r["numerics_ok"] is True and r["time_us"] > 0 and not r.get("pruned")
    for r in rec["wrong"]:
        assert r["numerics_ok"] is False
    assert rec["space_best"]["numerics_ok"] is True and rec["space_best"]["kernel"]
    col = sm.columns(rec)
    assert col["space_regret_label"] in sm.LABELS and col["space_regret"] is not None
    assert col["space_best_us"] > 0 and col["space_timed"] == cnt["timed"] and col["numerics_ok"] is True
    assert rec["trust"]["rounds"] == space.ROUNDS and rec["trust"]["noise_pct"] >= sm.NOISE_FLOOR_PCT


def test_a_wrong_pick_is_never_the_space_s_best(probe):
    """cuBLAS bug 6580689 on the H200 (tests/fixtures/numerics/hunt_splitk_h200.json.gz): the heuristic's own pick
    for 16 tokens, 4096 outputs, K = 2561, K strided (torch TN) is algo 66 64x32 split-K 2 and computes a wrong
    answer. The search flags it and crowns a correct config."""
    from cublaslt_probe.gpu import space
    rec = space.search(probe, Case("lt", "mm", "bf16", "TN", 16, 4096, 2561), budget_s=1.0, enum_budget_s=8)
    assert rec["pick"]["split_k"] == 2 and rec["pick"]["numerics_ok"] is False
    assert rec["counts"]["wrong"] >= 1 and any(r["rank"] == 0 for r in rec["wrong"])
    assert rec["trust"]["winner"] != "pick" and rec["space_best"]["numerics_ok"] is True
    col = sm.columns(rec)
    assert col["numerics_ok"] is False and col["space_best_config"] != sm.config_text(rec["pick"])
