#!/usr/bin/env python3
"""`sweep.run` with the dataset built along the sweep (a writer process) against built after it, A/B in one
process on the GPU machine.

    PYTHONPATH=. python3 benchmarks/bench_build_along.py [--preset decode] [--limit 2400]

One probe runs the preset's first --limit GEMMs five times through `sweep.run`: once to warm (the library's
caches and lazily loaded kernels; not counted), then built along, after, after, along. Per run: the GEMMs'
capture time, the time from the last record to the dataset in place, and GEMMs/s over both.
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="decode")
    ap.add_argument("--limit", type=int, default=2400)
    a = ap.parse_args()
    from cublaslt_probe import sweep
    from cublaslt_probe.probe import Probe, ProbeOptions
    cases = sweep.plan(a.preset).cases
    cases = list(cases[:a.limit]) if a.limit else cases
    probe = Probe(ProbeOptions(cpu_slot=0))
    res = {True: [], False: []}
    try:
        with tempfile.TemporaryDirectory() as d:
            for i, along in enumerate((False, True, False, False, True)):
                df = sweep.run(cases, os.path.join(d, f"r{i}.parquet"), probe, progress=False, build_along=along)
                ran = df.attrs["ran"]
                total = ran["seconds"] + ran["dataset_seconds"]
                line = (f"run {i} ({'warm-up, ' if i == 0 else ''}built {'along' if along else 'after'}): "
                        f"{ran['gemms']} GEMMs captured in {ran['seconds']:.2f} s ({ran['gemms'] / ran['seconds']:.1f}/s), "
                        f"dataset in place {ran['dataset_seconds']:.2f} s later; {ran['gemms'] / total:.1f} GEMMs/s "
                        f"over both; built along: {ran['built_along']}")
                print(line, flush=True)
                if i:
                    res[along].append((ran["gemms"], ran["seconds"], total))
    finally:
        probe.close()
    for along in (True, False):
        rates = [g / t for g, _, t in res[along]]
        caps = [g / s for g, s, _ in res[along]]
        print(f"built {'along' if along else 'after'}: {statistics.mean(rates):.1f} GEMMs/s over capture and dataset "
              f"(capture alone {statistics.mean(caps):.1f}/s), mean of {len(rates)} runs")


if __name__ == "__main__":
    main()
