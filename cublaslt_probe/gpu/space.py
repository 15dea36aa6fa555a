"""How large one algo's config space is for one problem (a measurement, not a sweep).

`measure(lib, torch, p, algo_id)`: the algo's capabilities (`lt.algo_caps`: tile, stages and cluster ids,
split-K support, reduction schemes, swizzling, custom options), then `cublasLtMatmulAlgoCheck` over every
(tile, stages, cluster) with split-K 1, custom option 0, no swizzling (the *base* configs), then, on a sample of
the valid bases, the split-K numbers, custom options and swizzles the library also accepts (the multipliers),
and the kernels a random sample of valid full configs launches (CUPTI). All under a time budget: what the
budget cut short is said in the result.
"""
from __future__ import annotations

import random
import time

SPLITS = (2, 3, 4, 6, 8, 16, 32)
CUSTOM_CAP = 32   # custom options tried per base (0..31): the count beyond is said, not measured


def measure(lib, torch, p, algo_id: int, *, budget_s: float = 60.0, sample_bases: int = 40,
            sample_kernels: int = 120, seed: int = 0) -> dict:
    from cublaslt_probe.gpu import lt
    from cublaslt_probe.gpu.probe import LtGemm, profile_kernels
    t0 = time.time()
    rng = random.Random(seed)
    out: dict = {"problem": {k: getattr(p, k) for k in ("m", "n", "k", "dtype", "trans_a", "trans_b")},
                 "algo_id": algo_id, "algo_ids_for_types": lt.algo_ids(lib, p)}
    caps = lt.algo_caps(lib, lt.init_algo(lib, p, algo_id))
    out["caps"] = {k: (len(v) if isinstance(v, list) else v) for k, v in caps.items()}
    tiles = caps.get("TILE_IDS") or [None]
    stages = caps.get("STAGES_IDS") or [None]
    clusters = caps.get("CLUSTER_SHAPE_IDS") or [None]
    out["tile_names"] = [lib.enums.name("tile", t) for t in tiles if t is not None]
    out["stages_names"] = [lib.enums.name("stages", s) for s in stages if s is not None]
    out["cluster_names"] = [lib.enums.name("cluster", c) for c in clusters if c is not None]
    with LtGemm(torch, lib, p) as g:
        valid, checked, refused_set = [], 0, 0
        combos = [(t, s, c) for t in tiles for s in stages for c in clusters]
        rng.shuffle(combos)   # a budget stop then leaves an unbiased sample: valid/checked estimates the share
        out["base_combinations"] = len(combos)
        t_check = time.time()
        for t, s, c in combos:
            if time.time() - t0 > budget_s * 0.5:
                out["base_check_stopped"] = f"after {checked} of {len(combos)} (half the budget)"
                break
            algo = lt.init_algo(lib, p, algo_id)
            st = lt.set_config_values(lib, algo, {"tile": t, "stages": s, "cluster": c, "split_k": 1,
                                                  "custom_option": 0, "cta_swizzling": 0})
            checked += 1
            if st:
                refused_set += 1
                continue
            st, res = lt.algo_check(g.mm, algo)
            if st == 0 and res.workspaceSize <= p.workspace_bytes:
                valid.append((t, s, c))
        out["base_checked"] = checked
        out["base_set_refused"] = refused_set
        out["base_valid"] = len(valid)
        out["base_valid_estimate"] = round(len(valid) / max(1, checked) * len(combos))
        out["check_us_each"] = round((time.time() - t_check) / max(1, checked) * 1e6, 1)
        out["valid_tiles"] = sorted({lib.enums.name("tile", t) for t, _, _ in valid if t is not None})
        out["valid_stages"] = sorted({lib.enums.name("stages", s) for _, s, _ in valid if s is not None})
        out["valid_clusters"] = sorted({lib.enums.name("cluster", c) for _, _, c in valid if c is not None})
        # multipliers on a sample of valid bases
        sample = rng.sample(valid, min(sample_bases, len(valid)))
        customs = range(min(CUSTOM_CAP, (caps.get("CUSTOM_OPTION_MAX") or 0) + 1))
        swz = range((caps.get("CTA_SWIZZLING_SUPPORT") or 0) + 1)
        split_ok, custom_ok, swz_ok, full = [], [], [], []
        for t, s, c in sample:
            if time.time() - t0 > budget_s * 0.75:
                break
            base = {"tile": t, "stages": s, "cluster": c, "split_k": 1, "custom_option": 0, "cta_swizzling": 0}
            counts = []
            for key, values in (("split_k", (1,) + SPLITS), ("custom_option", customs), ("cta_swizzling", swz)):
                ok = []
                for v in values:
                    algo = lt.init_algo(lib, p, algo_id)
                    if lt.set_config_values(lib, algo, {**base, key: v}):
                        continue
                    st, res = lt.algo_check(g.mm, algo)
                    if st == 0 and res.workspaceSize <= p.workspace_bytes:
                        ok.append(v)
                counts.append(ok)
            split_ok.append(len(counts[0]))
            custom_ok.append(len(counts[1]))
            swz_ok.append(len(counts[2]))
            full += [{**base, "split_k": sk, "custom_option": co, "cta_swizzling": sw}
                     for sk in counts[0] for co in counts[1][:4] for sw in counts[2]]
        n = max(1, len(split_ok))
        out["multiplier_sample"] = len(split_ok)
        out["mean_split_k_values_valid"] = sum(split_ok) / n
        out["mean_custom_options_valid"] = sum(custom_ok) / n
        out["mean_swizzles_valid"] = sum(swz_ok) / n
        out["custom_option_max"] = caps.get("CUSTOM_OPTION_MAX")
        out["estimated_configs"] = round(out["base_valid_estimate"] * out["mean_split_k_values_valid"] *
                                         out["mean_custom_options_valid"] * out["mean_swizzles_valid"])
        # kernels launched by a random sample of full configs (split-K x custom x swizzle of the sampled bases)
        runs = rng.sample(full, min(sample_kernels, len(full)))
        calls, kept = [], []
        for cfg in runs:
            if time.time() - t0 > budget_s:
                break
            algo = lt.init_algo(lib, p, algo_id)
            if lt.set_config_values(lib, algo, cfg):
                continue
            fn = g.call(algo)
            try:
                fn()
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                continue
            calls.append(fn)
            kept.append(cfg)
        names = []
        if calls:
            for ks in profile_kernels(torch, calls, torch.zeros(1, dtype=torch.int8, device="cuda")):
                names.append(tuple(n for n, _ in ks))
        out["kernel_sample_configs"] = len(calls)
        out["kernel_sample_distinct"] = len(set(names))
        out["kernel_sample_distinct_main"] = len({k[0] if k else None for k in names})
        out["kernel_sample_examples"] = sorted({k[0] for k in names if k})[:12]
        # the heuristic's pick among the valid bases
        res = g.heuristic(1)
        if res:
            cfg = lib.read_algo_config(res[0].algo)
            out["heuristic_pick"] = {k: cfg[k] for k in ("algo_id", "tile", "stages", "cluster", "split_k",
                                                         "custom_option")}
            out["heuristic_pick_in_valid_bases"] = (cfg["tile_enum"], cfg["stages_enum"], cfg["cluster_enum"]) in \
                set(valid)
    out["elapsed_s"] = round(time.time() - t0, 1)
    return out
