#!/usr/bin/env python3
"""Rows built while the sweep runs (`sweep.EarlyRows`) against rows built at its end, A/B in one process (run
it on the GPU machine).

    PYTHONPATH=. python3 benchmarks/bench_early_rows.py [--preset decode] [--warm 512]

One probe and one set of row builders (`sweep.RowBuilders`), as `sweep` starts them. The preset's first --warm
GEMMs run first, not counted; then the whole preset runs four times through `sweep.run` (capture and dataset),
each into a fresh output: with the rows built along, without, without, with. "Without" is the same
`EarlyRows` told of no window, so its rows are built from the raw file at the end, as before it. Printed per
run: the seconds of capture, of the dataset's build after it, and of the whole; then each mode's totals.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="decode")
    ap.add_argument("--warm", type=int, default=512)
    a = ap.parse_args()
    from cublaslt_probe import dataset, sweep  # noqa: F401  (imported at start-up, as `sweep` has them)
    from cublaslt_probe.probe import Probe, ProbeOptions
    builders = sweep.RowBuilders()
    probe = Probe(ProbeOptions(cpu_slot=0))
    cases = sweep.plan(a.preset).cases
    early_class = sweep.EarlyRows

    class Unused(early_class):
        def add(self, start, stop, records):   # told of no window: the rows are built at the end
            pass
    totals = {"along": [0.0, 0], "at the end": [0.0, 0]}
    try:
        with tempfile.TemporaryDirectory() as d:
            sweep.run(cases[:a.warm], os.path.join(d, "warm.parquet"), probe, progress=False, builders=builders)
            for i, mode in enumerate(("along", "at the end", "at the end", "along")):
                sweep.EarlyRows = early_class if mode == "along" else Unused
                t = time.time()
                df = sweep.run(cases, os.path.join(d, f"{i}.parquet"), probe, progress=False, builders=builders)
                wall = time.time() - t
                ran = df.attrs["ran"]
                totals[mode][0] += wall
                totals[mode][1] += len(df)
                print(f"run {i + 1}, rows built {mode}: {len(df)} GEMMs in {wall:.2f} s = {len(df) / wall:.1f} "
                      f"GEMMs/s; capture {ran['seconds']:.2f} s, dataset after it {ran['dataset_seconds']:.2f} s "
                      f"({ran['row_ranges_built_during']} ranges built along)")
    finally:
        sweep.EarlyRows = early_class
        probe.close()
        builders.close()
    for mode, (wall, n) in totals.items():
        print(f"rows built {mode}: {n} GEMMs in {wall:.2f} s = {n / wall:.1f} GEMMs/s (two runs)")


if __name__ == "__main__":
    main()
