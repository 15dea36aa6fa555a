"""Measure how algo 66's config space looks on a few problems (`gpu.space.measure`); writes JSON.

    python scripts/space_algo66.py OUT.json [--budget-s 40]

Problems (cuBLAS view, torch Linear layout TN, bf16): decode 16x4096x4096 (tokens 16), prefill 4096x4096x4096
and an MLP-up 14336x128x4096 (tokens 128). Also dumps the cublasLt.h comments of the capability and stages
enumerators it reads, so the element types assumed in `lt.CAP_TYPES` can be checked.
"""
from __future__ import annotations

import argparse
import json
import re
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=40.0)
    args = ap.parse_args(argv)
    import torch

    from cublaslt_probe.gpu import lt, space
    lib = lt.LtLibrary()
    header_notes = {}
    if lib.enums.header:
        with open(lib.enums.header, errors="replace") as f:
            text = f.read()
        for name in ("CUBLASLT_ALGO_CAP_TILE_IDS", "CUBLASLT_ALGO_CAP_STAGES_IDS",
                     "CUBLASLT_ALGO_CAP_CLUSTER_SHAPE_IDS", "CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX",
                     "CUBLASLT_MATMUL_STAGES_16x1", "CUBLASLT_MATMUL_STAGES_64xAUTO"):
            i = text.find(name)
            header_notes[name] = re.sub(r"\s+", " ", text[max(0, i - 400): i + 120]) if i >= 0 else None
    problems = [lt.Problem(4096, 16, 4096, trans_a="T"), lt.Problem(4096, 4096, 4096, trans_a="T"),
                lt.Problem(14336, 128, 4096, trans_a="T")]
    res = [space.measure(lib, torch, p, 66, budget_s=args.budget_s) for p in problems]
    out = {"env": {"gpu": torch.cuda.get_device_name(0), "cublaslt": lib.version_str, "torch": torch.__version__,
                   "cuda": torch.version.cuda}, "header_notes": header_notes, "results": res}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for r in res:
        print(json.dumps({k: v for k, v in r.items() if k not in ("tile_names", "stages_names", "cluster_names",
                                                                 "valid_tiles", "algo_ids_for_types")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
