"""The algo space beyond the heuristic: its size for one algo (`measure`) and the whole space of a GEMM, searched
and timed (`search`: `candidates --space`, `sweep --space`; its rules in `analysis.space`, docs/space.md).

`search(probe, case)`: every valid config of every algo id of the types (`signature_of`, once per process or
from $CUBLASLT_PROBE_SPACE_CACHE), the heuristic's top-N, then one config per distinct kernel and the leaders'
variants, first-sampled in batches (`first_samples`) and pruned, the survivors checked against a float64
reference and timed by the probe, the finalists in interleaved rounds (the trust model).

`measure(lib, torch, p, algo_id)`: the algo's capabilities (`lt.algo_caps`: tile, stages and cluster ids,
split-K support, reduction schemes, swizzling, custom options), then `cublasLtMatmulAlgoCheck` over every
(tile, stages, cluster, custom option, swizzle) with split-K 1 (the *base* configs; cluster shapes from cublasLt.h
when the library has no CLUSTER_SHAPE_IDS capability, as 13.1 has not), then, on a sample of
the valid bases, the split-K numbers the library also accepts (the multiplier),
and the kernels a random sample of valid full configs launches (CUPTI). All under a time budget: what the
budget cut short is said in the result.
"""
from __future__ import annotations

import json
import os
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


# --- the whole space of one GEMM, timed (`candidates --space`, `sweep --space`) ---------------------------------
BUDGET_S = 2.0          # wall-clock seconds of one GEMM's search (enumeration of its types excepted)
ENUM_BUDGET_S = 12.0    # seconds of AlgoCheck for the split-K-1 configs of one type signature (once per process)
SCREEN_SHARE = 0.7      # of the budget: the distinct kernels are screened until then ...
VARIANT_SHARE = 0.85    # ... the leaders' variants (custom options, swizzles, split-K) until then
LEADERS = 6             # kernels whose variants are timed
FINALISTS = 3           # the space's best few timed in the interleaved rounds
ROUNDS = 5              # interleaved rounds of the finalists
SAMPLES = 5             # timing samples of a config that survives its first sample
NAMING_PROBLEM = 256    # the m = n = k of the problem the configs' kernel names are read on (once per signature)
_SIGNATURES: dict = {}  # type signature -> `Signature`


def signature(p) -> tuple:
    """What the valid split-K-1 configs are enumerated once for: the problem's types, layout, batch, bias and
    alignment (docs/space.md: the valid set did not change with the shape on the three shapes measured)."""
    return (p.dtype, p.b_type, p.trans_a, p.trans_b, p.batch > 1, p.bias, p.alignment)


class Signature:
    """The split-K-1 configs cuBLASLt accepts for one type signature (`enumerate`) and the kernel each launches
    on a NAMING_PROBLEM³ problem of those types (`name_kernels`): `bases` (algo_id, tile, stages, cluster,
    custom, swizzle) enum values, `caps` per algo id, `kernel` base -> name, `stats`."""

    def __init__(self):
        self.bases: list[tuple] = []
        self.caps: dict = {}
        self.kernel: dict = {}
        self.stats: dict = {}


def _copy(algo):
    from cublaslt_probe.gpu import lt
    return lt.cublasLtMatmulAlgo_t.from_buffer_copy(algo)


def _values(b: tuple) -> dict:
    return {"tile": b[1], "stages": b[2], "cluster": b[3], "custom_option": b[4], "cta_swizzling": b[5]}


NVJET_ALGO = 66          # nvjet: the algo cuBLASLt's heuristic picks on most Hopper shapes (docs/space.md)
FULL_PRODUCT = 300_000   # an algo with at most this many combinations is checked in full (algo 66: 258,672)


def enumerate_bases(lib, mm, p, budget_s: float = ENUM_BUDGET_S, seed: int = 0) -> Signature:
    """Every (tile, stages, cluster, custom option, swizzle) of every algo id of `p`'s types that
    `cublasLtMatmulAlgoCheck` accepts with split-K 1 and a workspace within `p.workspace_bytes` (`mm`: an
    `lt.LtMatmul` of `p`).

    An algo's combinations are its capabilities' product (cluster shapes: every one cublasLt.h names when the
    library has no CLUSTER_SHAPE_IDS capability, as 13.1 has not). Up to FULL_PRODUCT of them are all checked;
    a larger product is checked in two steps: every (tile, stages, custom, swizzle) with the algo's default
    cluster, then every cluster shape of the valid ones (a config valid only with a non-default cluster whose
    default-cluster twin is refused is not seen: `stats["by_algo"]` says which algos were enumerated so).
    The algos are checked smallest first, each in a shuffled order within its share of what is left of
    `budget_s` (its share of the checks left; NVJET_ALGO half of it at least); what the budget cut short is in
    `stats["by_algo"]`."""
    from cublaslt_probe.gpu import lt
    t0 = time.time()
    rng = random.Random(seed)
    sig = Signature()
    ids = lt.algo_ids(lib, p)
    per_algo = []
    header_clusters = sorted(v for v, n in lib.enums.by_kind.get("cluster", {}).items() if n != "END")
    for a in ids:
        try:
            base = lt.init_algo(lib, p, a)
            caps = lt.algo_caps(lib, base)
        except Exception as e:  # noqa: BLE001  an id the library lists but cannot init for these types
            sig.stats.setdefault("init_failed", {})[a] = str(e)[:120]
            continue
        sig.caps[a] = {k: (v if not isinstance(v, list) else len(v)) for k, v in caps.items()}
        clusters = caps.get("CLUSTER_SHAPE_IDS")
        clusters = (header_clusters if clusters is None else clusters) or [None]
        rest = [(t, s, co, sw) for t in (caps.get("TILE_IDS") or [None]) for s in (caps.get("STAGES_IDS") or [None])
                for co in range((caps.get("CUSTOM_OPTION_MAX") or 0) + 1)
                for sw in range((caps.get("CTA_SWIZZLING_SUPPORT") or 0) + 1)]
        per_algo.append((a, base, rest, clusters))
    def need(x):   # the checks an algo's first step takes: its product, or its default-cluster product
        n = len(x[2]) * len(x[3])
        return n if n <= FULL_PRODUCT else len(x[2])
    per_algo.sort(key=need)   # the small algos first (each needs milliseconds), the largest products last
    left = sum(need(x) for x in per_algo)
    by_algo = {}

    def check(a, base, b):
        algo = _copy(base)
        if lt.set_config_values(lib, algo, _values(b)):
            return False
        st, res = lt.algo_check(mm, algo)
        return st == 0 and res.workspaceSize <= p.workspace_bytes

    for x in per_algo:
        a, base, rest, clusters = x
        n = len(rest) * len(clusters)
        share = need(x) / max(1, left)
        remaining = max(0.0, budget_s - (time.time() - t0))
        allot = remaining * (max(0.5, share) if a == NVJET_ALGO else share)
        allot = min(remaining, max(allot, need(x) * 200e-6))   # 200 µs a check: a small algo is checked whole
        left -= need(x)
        ta, checked, found = time.time(), 0, []
        full = n <= FULL_PRODUCT
        if full:
            combos = [(a, t, s, c, co, sw) for t, s, co, sw in rest for c in clusters]
        else:   # step 1: the algo's default cluster (None: not set)
            combos = [(a, t, s, None, co, sw) for t, s, co, sw in rest]
        rng.shuffle(combos)
        stopped = False
        for b in combos:
            if checked % 64 == 0 and time.time() - ta > allot:
                stopped = True
                break
            checked += 1
            if check(a, base, b):
                found.append(b)
        if not full and found and clusters != [None]:   # step 2: every cluster shape of the valid ones
            step1, found = found, []
            for b in step1:
                if time.time() - ta > 2 * allot:
                    stopped = True
                    break
                for c in clusters:
                    checked += 1
                    if check(a, base, b[:3] + (c,) + b[4:]):
                        found.append(b[:3] + (c,) + b[4:])
            if not found:   # no explicit cluster shape accepted: the default-cluster configs stand
                found = step1
        sig.bases += found
        by_algo[a] = {"combinations": n, "checked": checked, "valid": len(found),
                      "enumerated": "full" if full else "default cluster, then clusters of the valid",
                      "stopped_by_budget": stopped}
    sig.stats.update(algo_ids=ids, by_algo=by_algo, combinations=sum(v["combinations"] for v in by_algo.values()),
                     checked=sum(v["checked"] for v in by_algo.values()), valid=len(sig.bases),
                     seconds=round(time.time() - t0, 2))
    return sig


def groups_of(sig: Signature) -> dict:
    """The valid bases by (algo, tile, stages, cluster), custom option 0 and no swizzle first in each."""
    groups: dict = {}
    for b in sorted(sig.bases, key=lambda b: (b[4] or 0, b[5] or 0)):
        groups.setdefault(b[:4], []).append(b)
    return groups


def name_kernels(probe, sig: Signature, p, budget_s: float = 0.75 * ENUM_BUDGET_S, chunk: int = 512) -> None:
    """The kernel the first base of each (algo, tile, stages, cluster) group launches, read with CUPTI on a
    NAMING_PROBLEM³ problem of `p`'s types (a cheap run of each); configs that do not run there keep no name.
    NVJET_ALGO's groups are not run: each launches a kernel of its own (docs/space.md: 3,807 groups, 3,807
    names on the H200), and naming them costs seconds. Fills `sig.kernel`."""
    from dataclasses import replace

    from cublaslt_probe.analysis.evidence import main_kernel
    from cublaslt_probe.gpu import lt
    torch, lib = probe.torch, probe.lib
    t0 = time.time()
    small = replace(p, m=NAMING_PROBLEM, n=NAMING_PROBLEM, k=NAMING_PROBLEM, lda=None, ldb=None, ldc=None)
    firsts = [g[0] for g in groups_of(sig).values() if g[0][0] != NVJET_ALGO]
    inits: dict = {}
    with probe.lt_gemm(small) as g:
        for i in range(0, len(firsts), chunk):
            if time.time() - t0 > budget_s:
                sig.stats["naming_stopped"] = f"after {i} of {len(firsts)} configs (budget)"
                break
            calls, keys = [], []
            for b in firsts[i:i + chunk]:
                if b[0] not in inits:
                    inits[b[0]] = lt.init_algo(lib, small, b[0])
                algo = _copy(inits[b[0]])
                if lt.set_config_values(lib, algo, _values(b)) or lt.algo_check(g.mm, algo)[0]:
                    continue
                fn = g.call(algo)
                try:
                    fn()
                except Exception:  # noqa: BLE001  a config that does not run on the small problem
                    continue
                calls.append(fn)
                keys.append(b)
            torch.cuda.synchronize()
            if calls:
                for b, ks in zip(keys, probe.profile(calls)):
                    sig.kernel[b] = main_kernel([n for n, _ in ks])
    sig.stats["groups"] = len(firsts)
    sig.stats["named"] = len(sig.kernel)
    sig.stats["distinct_kernels"] = len(set(sig.kernel.values()))
    sig.stats["naming_seconds"] = round(time.time() - t0, 2)


CACHE_ENV = "CUBLASLT_PROBE_SPACE_CACHE"   # a JSON file the enumerated signatures are kept in across processes


def _cache_key(lib, key: tuple) -> str:
    return f"{lib.path}|{lib.version}|{key!r}"


def _load_cached(lib, key: tuple) -> Signature | None:
    path = os.environ.get(CACHE_ENV)
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            got = json.load(f).get(_cache_key(lib, key))
    except (OSError, ValueError):
        return None
    if not got:
        return None
    sig = Signature()
    sig.bases = [tuple(b) for b in got["bases"]]
    sig.caps = {int(a): c for a, c in got["caps"].items()}
    sig.kernel = {tuple(b): n for b, n in got["kernel"]}
    sig.stats = {**got["stats"], "by_algo": {int(a): v for a, v in got["stats"].get("by_algo", {}).items()},
                 "from_cache": path}
    return sig


def _store(lib, key: tuple, sig: Signature) -> None:
    path = os.environ.get(CACHE_ENV)
    if not path:
        return
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    data[_cache_key(lib, key)] = {"bases": sig.bases, "caps": sig.caps, "kernel": list(sig.kernel.items()),
                                  "stats": sig.stats}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def signature_of(probe, g, p, enum_budget_s: float = ENUM_BUDGET_S) -> Signature:
    """The process's `Signature` of `p`'s types, enumerated and named on first use — or read from the JSON
    file $CUBLASLT_PROBE_SPACE_CACHE names, when it holds one of this library (path and version), and written
    there after an enumeration: the workers of a sweep, and later runs, enumerate once."""
    key = signature(p)
    sig = _SIGNATURES.get(key)
    if sig is None:
        sig = _load_cached(probe.lib, key)
    if sig is None:
        sig = enumerate_bases(probe.lib, g.mm, p, enum_budget_s)
        name_kernels(probe, sig, p, budget_s=0.75 * enum_budget_s)
        _store(probe.lib, key, sig)
    _SIGNATURES[key] = sig
    return sig


def representatives(sig: Signature) -> tuple[list[tuple], dict]:
    """The configs screened first: one per (algo, tile, stages, cluster) group (custom option 0 and no swizzle
    preferred), groups whose first configs launch the same kernel (an algo that ignores the cluster shape)
    counted once; and the groups (`groups_of`), whose other configs are the leaders' variants."""
    groups = groups_of(sig)
    reps: dict = {}
    for members in groups.values():
        b = members[0]
        reps.setdefault(sig.kernel.get(b) or b, b)
    return list(reps.values()), groups


def forced_algo(lib, p, b: tuple, split_k: int = 1, reduction: int | None = None, init=None):
    """The algo of base config `b` (algo_id, tile, stages, cluster, custom, swizzle enum values) with SPLITK_NUM
    `split_k` (and REDUCTION_SCHEME `reduction` when split), for Problem `p`'s types; `init`: the algo id's
    `lt.init_algo` already made. None when the library refuses to set a value (not checked: `lt.algo_check`)."""
    from cublaslt_probe.gpu import lt
    algo = _copy(init if init is not None else lt.init_algo(lib, p, b[0]))
    vals = _values(b)
    if split_k > 1:
        vals.update(split_k=split_k, reduction_scheme=reduction)
    return None if lt.set_config_values(lib, algo, vals) else algo


def _cfg(lib, b: tuple, split_k: int = 1, reduction: int | None = None) -> dict:
    names = lib.enums.name
    return {"algo_id": b[0], "tile": None if b[1] is None else names("tile", b[1]),
            "stages": None if b[2] is None else names("stages", b[2]),
            "cluster": None if b[3] is None else names("cluster", b[3]), "custom_option": b[4],
            "cta_swizzling": b[5], "split_k": split_k,
            "reduction_scheme": None if reduction is None else names("reduction_scheme", reduction)}


SCREEN_GPU_US = 50_000.0   # GPU µs one screening chunk may take (its size: at most SCREEN_CHUNK configs)
SCREEN_CHUNK = 64
_EVENTS: dict = {}         # id(clock) -> the (start, end) event pairs the screening records again


def first_samples(timer, fns: list) -> list[tuple[float, bool]]:
    """One sample of each launch of `fns` (each run once before: its kernel loaded), by the probe's timing method
    for a batch of different calls: the calls queued back to back, each between two events, behind one GPU spin
    covering the host's whole enqueue time (`timing.enqueue_spin`, the host's µs per call learnt under the
    key "lt|screen"), one wait at the end. Returns (µs, behind) per call: `behind` when the GPU had reached
    the call's start event by the time the host had queued it (the sample may hold a launch gap: the caller
    samples it again). The events are kept for the next batch."""
    from cublaslt_probe.gpu.timing import HOST_US_GUESS, enqueue_spin
    clock = timer.clock
    events = _EVENTS.setdefault(id(clock), [])
    while len(events) < len(fns):
        events.append((clock.event(), clock.event()))
    host = timer.host_us.get("lt|screen", HOST_US_GUESS)
    st, rec, done = timer.stream(), clock.record, clock.done
    behind = []
    with timer.quiet():
        timer.spin(enqueue_spin(host, len(fns), 1))
        h = clock.host_us()
        for (s, e), fn in zip(events, fns):
            bad = rec(s, st); fn(); bad = rec(e, st) or bad  # noqa: E702  the timed sequence
            if bad:
                raise clock.error(bad, "cuEventRecord")
            behind.append(done(s))
        timer.host_us["lt|screen"] = (clock.host_us() - h) / max(1, len(fns))
    if fns:
        clock.wait(events[len(fns) - 1][1])
    return [(clock.elapsed_us(s, e), b) for (s, e), b in zip(events, behind)]


def search(probe, c, *, budget_s: float = BUDGET_S, top: int = 8, workspace_bytes: int | None = None,
           alignment: int = 16, prune_ratio: float | None = None, rounds: int = ROUNDS,
           enum_budget_s: float = ENUM_BUDGET_S, seed: int = 0) -> dict:
    """The whole space of lt-backend Case `c` (its cuBLAS view), timed under `budget_s` (docs/space.md):

    1. the valid split-K-1 configs of its types (`signature_of`: enumerated and named once per process);
    2. the heuristic's top-`top` candidates: each run, its first sample taken, its numerics checked and timed
       (`probe.time_gpu`, SAMPLES samples);
    3. one config per distinct kernel, in `analysis.space.screen_order`, in chunks: each checked on this shape
       (`cublasLtMatmulAlgoCheck`), run once (its kernel loaded), its first sample taken (`first_samples`);
       one far behind the best first sample so far is pruned (`analysis.space.prunes`), the others checked
       (numerics) and timed — until SCREEN_SHARE of the budget;
    4. the LEADERS fastest correct kernels' variants (their other custom options and swizzles, and every
       split-K number in SPLITS with each reduction scheme the algo allows) the same way, until VARIANT_SHARE;
    5. the finalists (the pick, the best of the top-N, the FINALISTS fastest correct) timed in `rounds`
       interleaved rounds, the pick first and last in each (`analysis.space.trust`), and their kernels read
       with CUPTI.

    Every config timed beyond its first sample has its numerics checked (`gpu.numerics`): a wrong one is
    counted and kept in `wrong`, never a leader, finalist or best. `seconds` holds where the time went
    (AlgoCheck, first samples, numerics, full timings, rounds). Returns the `space` record."""
    from cublaslt_probe.analysis import space as rules
    from cublaslt_probe.analysis.evidence import main_kernel
    from cublaslt_probe.gpu import lt, numerics
    from cublaslt_probe.gpu.operands import CUBLAS_WORKSPACE, lt_problem
    torch, lib = probe.torch, probe.lib
    ratio = rules.PRUNE_RATIO if prune_ratio is None else prune_ratio
    p = lt_problem(c, CUBLAS_WORKSPACE if workspace_bytes is None else workspace_bytes, alignment)
    rec: dict = {"budget_s": budget_s, "prune_ratio": ratio, "rounds": rounds, "top": top,
                 "strategy": "heuristic top-N, then one config per distinct kernel (wave-efficiency order, algos "
                             "interleaved), then the leaders' custom/swizzle/split-K variants; pruned after one "
                             f"sample when > {ratio} x best + {rules.PRUNE_SLACK_US} µs"}
    stages: dict = {}
    secs = dict.fromkeys(("check", "first", "numerics", "full", "rounds"), 0.0)
    with probe.lt_gemm(p) as g:
        t_sig = time.time()
        sig = signature_of(probe, g, p, enum_budget_s)
        stages["signature"] = round(time.time() - t_sig, 3)
        t0 = time.time()
        ref, absprod = numerics.reference(torch, p, g.A, g.B)
        inits: dict = {}
        timed: dict = {}      # config key -> row
        wrong: list = []
        best_first = [None]
        counts = {"timed": 0, "pruned": 0, "wrong": 0, "refused": 0, "failed": 0, "resampled": 0}

        def algo_of(b, split_k=1, reduction=None):
            t = time.perf_counter()
            if b[0] not in inits:
                inits[b[0]] = lt.init_algo(lib, p, b[0])
            algo = forced_algo(lib, p, b, split_k, reduction, inits[b[0]])
            ok = algo is not None
            if ok:
                st, res = lt.algo_check(g.mm, algo)
                ok = st == 0 and res.workspaceSize <= p.workspace_bytes
            secs["check"] += time.perf_counter() - t
            return algo if ok else None

        def finish(key, algo, cfg, rank, prune, fn, first):
            row = {**cfg, "rank": rank, "base": key[:6], "first_us": first}
            counts["timed"] += 1
            timed[key] = row
            if prune and rules.prunes(first, best_first[0], ratio):
                counts["pruned"] += 1
                row["pruned"] = True
                return
            t = time.perf_counter()
            red_out = cfg.get("reduction_scheme") not in (None, "NONE", "COMPUTE_TYPE")
            num = numerics.run_config(torch, g, algo, ref, absprod, split_k=cfg.get("split_k") or 1,
                                      reduction_in_output_type=red_out)
            row.update(numerics_ok=num["numerics_ok"], error_ratio=num["error_ratio"])
            t2 = time.perf_counter()
            row["time_us"] = probe.time_gpu(fn, SAMPLES, "lt|space").median_us
            row["fn"] = fn
            secs["numerics"] += t2 - t
            secs["full"] += time.perf_counter() - t2
            if not num["numerics_ok"]:
                counts["wrong"] += 1
                wrong.append(row)
            elif best_first[0] is None or first < best_first[0]:
                best_first[0] = first

        def screen(items):
            """Items (key, algo, cfg, rank, prune): run, first-sampled together, then pruned or timed."""
            t = time.perf_counter()
            ran = []
            for it in items:
                if it[0] in timed:
                    continue
                fn = g.call(it[1])
                try:
                    fn()   # loads its kernel: the first sample is the kernel's, not the loader's
                except Exception as e:  # noqa: BLE001
                    counts["failed"] += 1
                    timed[it[0]] = {**it[2], "rank": it[3], "error": str(e)[:160]}
                    continue
                ran.append((it, fn))
            samples = first_samples(probe.timer, [fn for _, fn in ran])
            again = [i for i, (_, behind) in enumerate(samples) if behind]
            if again:   # a launch gap may be in them: once more, behind a spin sized by the host's speed now
                counts["resampled"] += len(again)
                for i, got in zip(again, first_samples(probe.timer, [ran[i][1] for i in again])):
                    samples[i] = got
            secs["first"] += time.perf_counter() - t
            for (it, fn), (us, _) in zip(ran, samples):
                finish(*it, fn, us)

        # 2. the heuristic's candidates
        res = g.heuristic(top)
        items = []
        pick_key = None
        for rank, r in enumerate(res):
            cfg = lib.read_algo_config(r.algo)
            key = (cfg["algo_id"], cfg["tile_enum"], cfg["stages_enum"], cfg["cluster_enum"], cfg["custom_option"],
                   cfg["cta_swizzling"], cfg["split_k"] or 1,
                   cfg["reduction_scheme_enum"] if (cfg["split_k"] or 1) > 1 else None)
            items.append((key, _copy(r.algo), {k: cfg[k] for k in ("algo_id", "tile", "stages", "cluster",
                                                                   "custom_option", "cta_swizzling", "split_k",
                                                                   "reduction_scheme")}, rank, False))
            if rank == 0:
                pick_key = key
        screen(items)
        topn = [timed[it[0]] for it in items if it[0] in timed]
        pick = timed.get(pick_key)
        stages["topn"] = round(time.time() - t0, 3)
        ref_us = (pick or {}).get("first_us") or 10.0
        chunk = max(8, min(SCREEN_CHUNK, int(SCREEN_GPU_US / ref_us)))
        # 3. one config per distinct kernel
        reps, groups = representatives(sig)
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        order = rules.screen_order([_cfg(lib, b) for b in reps], p.m, p.n, sms)
        screened = 0
        for at in range(0, len(order), chunk):
            if time.time() - t0 > SCREEN_SHARE * budget_s:
                break
            items = []
            for i in order[at:at + chunk]:
                b = reps[i]
                algo = algo_of(b)
                screened += 1
                if algo is None:
                    counts["refused"] += 1
                    continue
                items.append((b + (1, None), algo, _cfg(lib, b), None, True))
            screen(items)
        stages["screen"] = round(time.time() - t0, 3)
        # 4. the leaders' variants
        good = sorted((r for r in timed.values() if r.get("numerics_ok") and r.get("time_us")),
                      key=lambda r: r["time_us"])
        leaders = []
        for r in good:
            if r["base"][:4] not in {x[:4] for x in leaders}:
                leaders.append(r["base"])
            if len(leaders) >= LEADERS:
                break
        cands = []
        for b in leaders:
            caps = sig.caps.get(b[0], {})
            cands += [(v, 1, None) for v in groups.get(b[:4], [])]
            if caps.get("SPLITK_SUPPORT"):
                mask = caps.get("REDUCTION_SCHEME_MASK") or 0
                schemes = [1 << i for i in range(8) if mask >> i & 1] or [None]
                cands += [(b, s, red) for s in SPLITS for red in schemes]
        variants = 0
        for at in range(0, len(cands), chunk):
            if time.time() - t0 > VARIANT_SHARE * budget_s:
                break
            items = []
            for v, s, red in cands[at:at + chunk]:
                if v + (s, red) in timed:
                    continue
                algo = algo_of(v, s, red)
                if algo is None:
                    counts["refused"] += 1
                    continue
                variants += 1
                items.append((v + (s, red), algo, _cfg(lib, v, s, red), None, True))
            screen(items)
        stages["variants"] = round(time.time() - t0, 3)
        # 5. the finalists in interleaved rounds
        t = time.perf_counter()
        good = sorted((r for r in timed.values() if r.get("numerics_ok") and r.get("time_us")),
                      key=lambda r: r["time_us"])
        fin: dict = {}
        if pick is not None and pick.get("fn") is not None:
            fin["pick"] = pick
        tb = min((r for r in topn if r.get("numerics_ok") and r.get("time_us")), key=lambda r: r["time_us"],
                 default=None)
        if tb is not None and tb is not pick:
            fin["topn_best"] = tb
        for j, r in enumerate(x for x in good if all(x is not y for y in fin.values())):
            if j >= FINALISTS:
                break
            fin[f"space_{j + 1}"] = r
        rounds_t = []
        if "pick" in fin:
            names = [nm for nm in fin if nm != "pick"]
            for i in range(rounds):
                rot = names[i % len(names):] + names[:i % len(names)] if names else []
                one = {"pick": probe.time_gpu(fin["pick"]["fn"], SAMPLES, "lt|space").median_us}
                for nm in rot:
                    one[nm] = probe.time_gpu(fin[nm]["fn"], SAMPLES, "lt|space").median_us
                one["pick#2"] = probe.time_gpu(fin["pick"]["fn"], SAMPLES, "lt|space").median_us
                rounds_t.append(one)
        tr = rules.trust(rounds_t, "pick", [nm for nm in fin if nm != "pick"],
                         pick_ok=bool(pick and pick.get("numerics_ok")))
        tr["times"] = rounds_t
        if fin:
            for r, ks in zip(fin.values(), probe.profile([r["fn"] for r in fin.values()])):
                r["kernel"] = main_kernel([n for n, _ in ks])
        secs["rounds"] = time.perf_counter() - t
        stages["finalists"] = round(time.time() - t0, 3)
        # split-K share of the valid configs (a sample of the bases): the space's size on this shape
        sample = random.Random(seed).sample(sig.bases, min(40, len(sig.bases)))
        split_ok = 0
        for b in sample:
            if sig.caps.get(b[0], {}).get("SPLITK_SUPPORT"):
                split_ok += sum(1 for s in SPLITS if algo_of(b, s, None) is not None)
        mean_split = split_ok / max(1, len(sample))

    def slim(r):
        return None if r is None else {k: v for k, v in r.items() if k != "fn"}
    counts.update(valid_bases=len(sig.bases), valid=round(len(sig.bases) * (1 + mean_split)),
                  kernels=len(reps), screened=screened, variants=variants)
    winner = fin.get(tr.get("winner")) if tr.get("winner") else None
    rec.update({
        "signature": {k: sig.stats.get(k) for k in ("algo_ids", "combinations", "checked", "valid", "seconds",
                                                    "named", "distinct_kernels", "naming_seconds", "naming_stopped",
                                                    "from_cache")},
        "counts": counts, "split_k_per_config": mean_split, "stage_s": stages,
        "seconds": {k: round(v, 4) for k, v in secs.items()},
        "elapsed_s": round(time.time() - t0, 3),
        "pick": slim(pick), "pick_in_space": None if pick_key is None else (pick_key[:6] in set(sig.bases)),
        "topn_best": None if tb is None else {**slim(tb), "name": "pick" if tb is pick else "topn_best"},
        "space_best": None if winner is None else {**slim(winner), "name": tr["winner"]},
        "finalists": {nm: slim(r) for nm, r in fin.items()}, "trust": tr,
        "leaders": [slim(r) for r in good[:10]], "wrong": [slim(r) for r in wrong[:20]],
    })
    return rec


def trust_candidates(probe, ran: list, dtype: str, rounds: int = ROUNDS) -> dict | None:
    """The trust model of `lt_candidates`' regret: the pick (rank 0) and the two fastest usable candidates
    (`analysis.candidates.usable`: ran, correct, within tolerance of the pick) timed in `rounds` interleaved
    rounds, the pick first and last in each (`analysis.space.trust`); `ran` holds (row, launch) in rank order.
    None when the pick did not run or is not usable."""
    from cublaslt_probe.analysis import candidates as cm
    from cublaslt_probe.analysis import space as rules
    ok = [(row, fn) for row, fn in ran if cm.usable(row, dtype)]
    if not ok or ok[0][0]["rank"] != 0:
        return None
    pick_fn = ok[0][1]
    others = sorted(ok[1:], key=lambda x: x[0]["time_us"])[:2]
    fns = {f"#{row['rank']}": fn for row, fn in others}
    names = list(fns)
    times = []
    for i in range(rounds):
        one = {"pick": probe.time_gpu(pick_fn, SAMPLES, "lt|trust").median_us}
        for nm in names[i % len(names):] + names[:i % len(names)] if names else []:
            one[nm] = probe.time_gpu(fns[nm], SAMPLES, "lt|trust").median_us
        one["pick#2"] = probe.time_gpu(pick_fn, SAMPLES, "lt|trust").median_us
        times.append(one)
    tr = rules.trust(times, "pick", names)
    tr["times"] = times
    return tr
