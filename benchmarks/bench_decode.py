#!/usr/bin/env python3
"""Kernel-name decoding throughput against `str.split('_')` over the same names, in the same run.

    python benchmarks/bench_decode.py [--repeat-n 1000000] [--distinct-n 20000] [--check]

Two workloads:
  cold      every name distinct, cache cleared first: the full grammar parse of each name;
  repeated  a trace-like stream: a few hundred distinct names repeated (the cache answers).
Names: the captured fixture names (tests/fixtures/names) plus generated variants of real grammars
(tiles, stages, clusters, flags) to reach --distinct-n distinct names. Each measurement is the best of
--rounds rounds. Targets: repeated >= 1 M names/s and at most 5x the str.split baseline; --check exits 1
when a target is missed.

A third table, first sight by family, decodes every real name of the other families (H200 traces,
captured programs, public names: tests/fixtures/names/public_names.jsonl) once with the cache cleared,
and reports names/s and mean microseconds per name for each family (no target: CUTLASS 3 templates are
kilobytes of C++ and some need the pure-Python demangler).
"""
from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import random
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cublaslt_probe.names import clear_cache, decode

FIXTURES = ROOT / "tests" / "fixtures" / "names"


def fixture_names() -> list[str]:
    out: set[str] = set()
    p = FIXTURES / "names.jsonl"
    if p.exists():
        out.update(json.loads(line)["kernel"] for line in p.open(encoding="utf-8") if line.strip())
    p = FIXTURES / "nvjet_configs.jsonl"
    if p.exists():
        for line in p.open(encoding="utf-8"):
            if line.strip():
                out.update(json.loads(line)["kernels"])
    return sorted(out)


def other_family_names() -> list[str]:
    """Real names of the families beyond cuBLAS: public names, H200 trace kernels, captured programs."""
    import gzip
    out: set[str] = set()
    p = FIXTURES / "public_names.jsonl"
    if p.exists():
        out.update(json.loads(line)["name"] for line in p.open(encoding="utf-8") if line.strip())
    traces = sorted((ROOT / "tests" / "fixtures" / "traces").glob("*.json.gz"))
    traces += sorted((ROOT / "tests" / "fixtures" / "programs").glob("*/trace.json.gz"))
    for t in traces:
        with gzip.open(t, "rt", encoding="utf-8") as f:
            out.update(e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel")
    for t in sorted((ROOT / "tests" / "fixtures" / "programs").glob("**/names.txt")):
        out.update(ln.rstrip("\n") for ln in t.open(encoding="utf-8") if ln.strip())
    return sorted(out)


def bench_first_sight(names: list[str], rounds: int) -> list[tuple[str, int, float]]:
    """(family, names, seconds per name) for each family, best of `rounds` cold passes."""
    by_family: dict[str, list[str]] = {}
    for n in names:
        by_family.setdefault(decode(n).family, []).append(n)
    out = []
    for fam, group in sorted(by_family.items()):
        def dec(group=group):
            clear_cache()
            for n in group:
                decode(n)
        out.append((fam, len(group), best(dec, rounds) / len(group)))
    return out


def generated_names(n: int, seed: int = 0) -> list[str]:
    """Distinct names in the shapes of the real grammars (nvjet, xmma, cutlass, legacy)."""
    rng = random.Random(seed)
    tiles = [8, 16, 32, 64, 96, 128, 144, 160, 192, 256, 320, 384, 512]
    out: set[str] = set()
    makers = [
        lambda: (f"nvjet_sm90_{rng.choice(['tst', 'hsh', 'qqtst', 'qrtst'])}_{rng.choice(tiles)}x"
                 f"{rng.choice(tiles)}_{rng.choice([64, 128])}x{rng.randint(2, 16)}_{rng.choice([1, 2, 4])}x"
                 f"{rng.choice([1, 2, 4])}_{rng.choice('hv')}_bz{rng.choice(['', '_coopA', '_coopB'])}"
                 f"{rng.choice(['', '_splitK'])}{rng.choice(['', '_bias'])}_{rng.choice(['T', 'N'])}"
                 f"{rng.choice(['T', 'N'])}{rng.choice(['T', 'N'])}"),
        lambda: (f"sm90_xmma_gemm_f32f32_tf32f32_f32_{rng.choice(['tn', 'nt', 'nn', 'tt'])}_n_tilesize"
                 f"{rng.choice(tiles)}x{rng.choice(tiles)}x32_warpgroupsize{rng.choice([1, 2])}x1x1_execute_"
                 f"segment_k_{rng.choice(['on', 'off'])}_kernel__5x_cublas"),
        lambda: (f"cutlass_80_tensorop_{rng.choice(['', 'bf16_', 'f16_'])}s16816gemm_bf16_{rng.choice(tiles)}x"
                 f"{rng.choice(tiles)}_{rng.choice([16, 32, 64])}x{rng.randint(2, 7)}_"
                 f"{rng.choice(['tn', 'nt', 'nn', 'tt'])}_align{rng.choice([1, 2, 4, 8])}"),
        lambda: (f"ampere_bf16_s16816gemm_bf16_{rng.choice(tiles)}x{rng.choice(tiles)}_ldg8_f2f_stages_"
                 f"{rng.choice([32, 64])}x{rng.randint(2, 6)}_{rng.choice(['tn', 'nt', 'nn', 'tt'])}"),
    ]
    for _ in itertools.count():
        if len(out) >= n:
            break
        out.add(rng.choice(makers)())
    return sorted(out)


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_cold(names: list[str], rounds: int) -> tuple[float, float]:
    def dec():
        clear_cache()
        for n in names:
            decode(n)

    def split():
        for n in names:
            n.split("_")
    return best(dec, rounds), best(split, rounds)


def bench_repeated(stream: list[str], rounds: int) -> tuple[float, float]:
    for n in set(stream):   # warm the cache: this workload measures the trace-like steady state
        decode(n)

    def dec():
        for n in stream:
            decode(n)

    def split():
        for n in stream:
            n.split("_")
    return best(dec, rounds), best(split, rounds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--distinct-n", type=int, default=20_000, help="distinct names for the cold run")
    ap.add_argument("--repeat-n", type=int, default=1_000_000, help="names in the repeated stream")
    ap.add_argument("--repeat-distinct", type=int, default=300, help="distinct names in the repeated stream")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    a = ap.parse_args(argv)

    real = fixture_names()
    distinct = sorted(set(real) | set(generated_names(max(0, a.distinct_n - len(real)))))
    rng = random.Random(1)
    pool = rng.sample(distinct, min(a.repeat_distinct, len(distinct)))
    stream = [rng.choice(pool) for _ in range(a.repeat_n)]
    mean_len = sum(map(len, distinct)) / len(distinct)

    print(f"names: {len(distinct):,} distinct ({len(real):,} captured on the H200, the rest generated), "
          f"mean length {mean_len:.0f} chars; repeated stream {len(stream):,} names over {len(pool)} distinct; "
          f"best of {a.rounds} rounds; Python {sys.version.split()[0]}")
    t_dec, t_split = bench_cold(distinct, a.rounds)
    cold_rate, cold_ratio = len(distinct) / t_dec, t_dec / t_split
    print(f"cold      decode {cold_rate:>12,.0f} names/s   str.split {len(distinct) / t_split:>12,.0f} names/s"
          f"   ratio {cold_ratio:6.1f}x")
    t_dec, t_split = bench_repeated(stream, a.rounds)
    rep_rate, rep_ratio = len(stream) / t_dec, t_dec / t_split
    print(f"repeated  decode {rep_rate:>12,.0f} names/s   str.split {len(stream) / t_split:>12,.0f} names/s"
          f"   ratio {rep_ratio:6.2f}x")
    others = other_family_names()
    print(f"first sight by family ({len(others)} real names of the families beyond cuBLAS, cache cleared, "
          f"best of {a.rounds}):")
    for fam, count, per in bench_first_sight(others, a.rounds):
        print(f"  {fam:<18} {count:>4} names  {1 / per:>10,.0f} names/s  {per * 1e6:>8.1f} us/name")
    ok_rate, ok_ratio = rep_rate >= 1e6, rep_ratio <= 5
    print(f"targets   repeated >= 1,000,000 names/s: {'met' if ok_rate else 'MISSED'}; "
          f"repeated <= 5x str.split: {'met' if ok_ratio else 'MISSED'}; "
          f"cold is {cold_ratio:.0f}x str.split (full parse, no target)")
    return 0 if (ok_rate and ok_ratio) or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
