"""Benchmark: one very large event in a trace costs about what decoding that event costs, not more.

A/B in one process, on a real trace (tests/fixtures/programs/gpt2_train): A is the trace with one cpu_op whose
args hold a list of ``--pairs`` [i, i+1] pairs inserted in the middle (a torch op given a huge list, as
``Concrete Inputs`` records it), B the same trace without it. The figure is the ratio
(time(A) - time(B)) / time(json.loads of that event's text): 1 means the reader adds nothing beyond the json
module's own decoding of the event; a reader that re-scans the event or re-copies its buffer per chunk shows
a ratio that grows with the event. Best of ``--reps``; chunk size as `read_chrome_trace` uses by default.

Usage: python benchmarks/bench_trace_big_event.py [--pairs 2000000] [--reps 3]
"""
from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from pathlib import Path

from cublaslt_probe.analysis.trace import read_chrome_trace

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "programs" / "gpt2_train" / "trace.json.gz"


def best(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2_000_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    ev = doc["traceEvents"]
    big = dict(next(e for e in ev if e.get("cat") == "cpu_op"))
    big["args"] = dict(big["args"], **{"Concrete Inputs": [[i, i + 1] for i in range(args.pairs)]})
    text = json.dumps(big, indent=1)
    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d) / "a.json", Path(d) / "b.json"
        b.write_text(json.dumps(doc, indent=1))
        doc["traceEvents"] = ev[:len(ev) // 2] + [big] + ev[len(ev) // 2:]
        a.write_text(json.dumps(doc, indent=1))
        t_a = best(lambda: read_chrome_trace(a), args.reps)
        t_b = best(lambda: read_chrome_trace(b), args.reps)
        t_ev = best(lambda: json.loads(text), args.reps)
    print(f"event {len(text) / 1e6:,.1f} MB: trace with it {t_a:.2f} s, without {t_b:.2f} s, json.loads of the "
          f"event alone {t_ev:.2f} s; ratio (A - B) / loads = {(t_a - t_b) / t_ev:.2f}")


if __name__ == "__main__":
    main()
