"""How large one algo's config space is for one problem (a measurement, not a sweep).

`measure(lib, torch, p, algo_id)`: the algo's capabilities (`lt.algo_caps`: tile, stages and cluster ids,
split-K support, reduction schemes, swizzling, custom options), then `cublasLtMatmulAlgoCheck` over every
(tile, stages, cluster, custom option, swizzle) with split-K 1 (the *base* configs; cluster shapes from cublasLt.h
when the library has no CLUSTER_SHAPE_IDS capability, as 13.1 has not), then, on a sample of
the valid bases, the split-K numbers the library also accepts (the multiplier),
and the kernels a random sample of valid full configs launches (CUPTI). All under a time budget: what the
budget cut short is said in the result.
"""
from __future__ import annotations

import random
import time

SPLITS = (2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32)


def measure(lib, torch, p, algo_id: int, *, budget_s: float = 60.0, sample_bases: int = 40,
            sample_kernels: int = 1500, seed: int = 0) -> dict:
    from cublaslt_probe.gpu import lt
    from cublaslt_probe.gpu.kernel_capture import profile_kernels
    from cublaslt_probe.gpu.operands import LtGemm
    t0 = time.time()
    rng = random.Random(seed)
    out: dict = {"problem": {k: getattr(p, k) for k in ("m", "n", "k", "dtype", "trans_a", "trans_b")},
                 "algo_id": algo_id, "algo_ids_for_types": lt.algo_ids(lib, p)}
    caps = lt.algo_caps(lib, lt.init_algo(lib, p, algo_id))
    out["caps"] = {k: (len(v) if isinstance(v, list) else v) for k, v in caps.items()}
    tiles = caps.get("TILE_IDS") or [None]
    stages = caps.get("STAGES_IDS") or [None]
    clusters = caps.get("CLUSTER_SHAPE_IDS")
    if clusters is None:   # no capability for it in this cuBLAS: every cluster shape cublasLt.h names
        clusters = sorted(v for v, n in lib.enums.by_kind.get("cluster", {}).items() if n != "END")
        out["clusters_from"] = "cublasLt.h (no CLUSTER_SHAPE_IDS capability)"
    clusters = clusters or [None]
    customs = list(range((caps.get("CUSTOM_OPTION_MAX") or 0) + 1))
    swizzles = list(range((caps.get("CTA_SWIZZLING_SUPPORT") or 0) + 1))
    out["tile_names"] = [lib.enums.name("tile", t) for t in tiles if t is not None]
    out["stages_names"] = [lib.enums.name("stages", s) for s in stages if s is not None]
    out["cluster_names"] = [lib.enums.name("cluster", c) for c in clusters if c is not None]
    with LtGemm(torch, lib, p) as g:
        valid, checked, refused_set = [], 0, 0
        combos = [(t, s, c, co, sw) for t in tiles for s in stages for c in clusters for co in customs
                  for sw in swizzles]
        rng.shuffle(combos)   # a budget stop then leaves an unbiased sample: valid/checked estimates the share
        out["base_combinations"] = len(combos)
        t_check = time.time()
        for t, s, c, co, sw in combos:
            if time.time() - t0 > budget_s * 0.5:
                out["base_check_stopped"] = f"after {checked} of {len(combos)} (half the budget)"
                break
            algo = lt.init_algo(lib, p, algo_id)
            st = lt.set_config_values(lib, algo, {"tile": t, "stages": s, "cluster": c, "split_k": 1,
                                                  "custom_option": co, "cta_swizzling": sw})
            checked += 1
            if st:
                refused_set += 1
                continue
            st, res = lt.algo_check(g.mm, algo)
            if st == 0 and res.workspaceSize <= p.workspace_bytes:
                valid.append((t, s, c, co, sw))
        out["base_checked"] = checked
        out["base_set_refused"] = refused_set
        out["base_valid"] = len(valid)
        out["base_valid_estimate"] = round(len(valid) / max(1, checked) * len(combos))
        out["check_us_each"] = round((time.time() - t_check) / max(1, checked) * 1e6, 1)
        out["valid_tiles"] = sorted({lib.enums.name("tile", v[0]) for v in valid if v[0] is not None})
        out["valid_tile_clusters"] = len({(v[0], v[2]) for v in valid})
        out["valid_stages"] = sorted({lib.enums.name("stages", v[1]) for v in valid if v[1] is not None})
        out["valid_clusters"] = sorted({lib.enums.name("cluster", v[2]) for v in valid if v[2] is not None})
        out["valid_custom_options"] = sorted({v[3] for v in valid})
        # split-K numbers the library also accepts, on a sample of the valid bases
        sample = rng.sample(valid, min(sample_bases, len(valid)))
        split_ok, full = [], []
        for t, s, c, co, sw in sample:
            if time.time() - t0 > budget_s * 0.75:
                break
            base = {"tile": t, "stages": s, "cluster": c, "split_k": 1, "custom_option": co, "cta_swizzling": sw}
            ok = []
            for v in SPLITS:
                algo = lt.init_algo(lib, p, algo_id)
                if lt.set_config_values(lib, algo, {**base, "split_k": v}):
                    continue
                st, res = lt.algo_check(g.mm, algo)
                if st == 0 and res.workspaceSize <= p.workspace_bytes:
                    ok.append(v)
            split_ok.append(len(ok))
            full += [base] + [{**base, "split_k": v} for v in ok]
        n = max(1, len(split_ok))
        out["split_sample"] = len(split_ok)
        out["split_values_tried"] = list(SPLITS)
        out["mean_split_k_values_valid"] = sum(split_ok) / n
        out["custom_option_max"] = caps.get("CUSTOM_OPTION_MAX")
        out["estimated_configs"] = round(out["base_valid_estimate"] * (1 + out["mean_split_k_values_valid"]))
        # kernels launched: a random sample of the valid bases (split-K 1) and the split-K configs of the sample
        bases = [{"tile": t, "stages": s, "cluster": c, "split_k": 1, "custom_option": co, "cta_swizzling": sw}
                 for t, s, c, co, sw in rng.sample(valid, min(sample_kernels, len(valid)))]
        splits = [f for f in full if f["split_k"] > 1]
        kinds, calls = [], []
        for kind, cfg in [("base", c) for c in bases] + [("split", c) for c in splits]:
            if time.time() - t0 > budget_s:
                out["kernel_sample_stopped"] = "budget"
                break
            algo = lt.init_algo(lib, p, algo_id)
            if lt.set_config_values(lib, algo, cfg):
                continue
            fn = g.call(algo)
            try:
                fn()
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001  a config that cannot run is not in the space
                continue
            calls.append(fn)
            kinds.append((kind, cfg))
        names = []
        if calls:
            for ks in profile_kernels(torch, calls, torch.zeros(1, dtype=torch.int8, device="cuda")):
                names.append(next((n for n, _ in ks if n.startswith("nvjet")), ks[0][0] if ks else None))
        for kind in ("base", "split"):
            got = [(cfg, n) for (k, cfg), n in zip(kinds, names) if k == kind]
            out[f"kernels_{kind}_configs_run"] = len(got)
            out[f"kernels_{kind}_distinct"] = len({n for _, n in got})
        got = [(cfg, n) for (k, cfg), n in zip(kinds, names) if k == "base"]
        by_tc: dict = {}
        for cfg, n in got:
            by_tc.setdefault((cfg["tile"], cfg["cluster"]), set()).add(n)
        out["kernels_per_tile_cluster_max"] = max((len(v) for v in by_tc.values()), default=0)
        out["kernel_examples"] = sorted({n for n in names if n})[:12]
        # the heuristic's pick among the valid bases
        res = g.heuristic(1)
        if res:
            cfg = lib.read_algo_config(res[0].algo)
            out["heuristic_pick"] = {k: cfg[k] for k in ("algo_id", "tile", "stages", "cluster", "split_k",
                                                         "custom_option")}
            out["heuristic_pick_in_valid_bases"] = (cfg["tile_enum"], cfg["stages_enum"], cfg["cluster_enum"],
                                                     cfg["custom_option"], cfg["cta_swizzling"]) in set(valid)
    out["elapsed_s"] = round(time.time() - t0, 1)
    return out
