"""`nvmmh`: NVIDIA's nvMatmulHeuristics beside the cuBLASLt picks of a dataset (cublaslt_probe.nvmmh)."""
from __future__ import annotations

import click

from cublaslt_probe.cli._common import (
    FORMATS,
    cell,
    check_dataset_file,
    out_format,
    output_options,
    render_table,
    write_frame,
)
from cublaslt_probe.nvmmh import TARGET, TARGETS, TOP

_BY = ("dtype", "backend", "op", "layout")
# The people's view of --columns: the GEMM, cuBLASLt's pick and what the model says of it.
_ROW_VIEW = ("backend", "dtype", "layout", "m", "n", "k", "algo_tile", "algo_cluster", "time_us", "nvmmh_tile",
             "nvmmh_cluster", "nvmmh_us", "nvmmh_agrees", "nvmmh_tile_rank")


@click.command("nvmmh")
@click.argument("dataset", type=click.Path(dir_okay=False))
@click.option("--gpu", default=None,
              help="GPU to model: H200, H100, 'NVIDIA H100 PCIe' or a library name such as H200_SXM "
                   "[default: the dataset's own].")
@click.option("-k", "--top-k", "top_k", type=click.IntRange(1, 64), default=TOP, show_default=True,
              help="Configs asked of the model per GEMM (the pick's tile is looked for among them).")
@click.option("--target", type=click.Choice(TARGETS), default=TARGET, show_default=True,
              help="The library family the model ranks configs for.")
@click.option("--dtype", "dtypes", multiple=True, help="Only this dtype (repeatable).")
@click.option("--by", type=click.Choice(_BY), default="dtype", show_default=True,
              help="Summary: one row per value of this column, and one for all.")
@click.option("--columns", is_flag=True,
              help="Write the dataset's rows with the nvmmh_* columns (nvmmh_tile, nvmmh_us, nvmmh_agrees, ...) "
                   "instead of the summary.")
@output_options(FORMATS, top=25)
def nvmmh_cmd(dataset, gpu, top_k, target, dtypes, by, columns, fmt, output, top):
    """nvMatmulHeuristics' configs beside cuBLASLt's picks: agreement and prediction error.

    Asks NVIDIA's analytic model (pip install nvidia-matmul-heuristics; it runs on a CPU, the GPU named
    by --gpu or the dataset) for its top-k configs of every measured GEMM in DATASET, in cuBLAS's
    column-major problem, and scores them against the kernel cuBLASLt picked: top-1 CTA tile agreement,
    tile and cluster agreement, the pick's tile anywhere in the top-k, and |ln(predicted / measured µs)|
    of the model's top-1 against the pick's time_us. docs/nvmmh.md says how configs map.

    \b
      cublaslt-probe nvmmh data/h200_llm.parquet --dtype bf16
      cublaslt-probe nvmmh data/h200_llm.parquet --columns -o llm_nvmmh.parquet
    """
    from cublaslt_probe.analysis.dataset import read_parquet
    from cublaslt_probe.nvmmh import scored, summary
    fmt = out_format(fmt, output, FORMATS)
    check_dataset_file(dataset)
    df = read_parquet(dataset)
    if dtypes:
        df = df[df["dtype"].astype(str).isin(dtypes)]
        if df.empty:
            raise click.UsageError(f"--dtype {', '.join(dtypes)}: no row of {dataset} has it")
    sc = scored(df, gpu=gpu, top=top_k, target=target)
    if columns:
        view = [c for c in _ROW_VIEW if c in sc.columns]
        n = top if top is not None else (25 if fmt == "table" else 0)
        shown = sc.head(n) if n else sc
        more = f"… {len(sc) - n:,} more rows (--top 0 shows all)\n" if n and len(sc) > n else ""
        write_frame(shown, fmt, output, lambda: render_table(
            view, ([cell(v, ".1f" if isinstance(v, float) else "") for v in r]
                   for r in shown[view].itertuples(index=False))) + more)
    else:
        s = summary(sc, by=by)
        write_frame(s, fmt, output, lambda: _summary_table(s, sc.attrs["nvmmh"]))
    if output and output != "-":
        click.echo(f"wrote {output}", err=True)


def _summary_table(s, about: dict) -> str:
    head = (f"nvMatmulHeuristics ({about['target']}, {about['gpu']}, top {about['top']}) against cuBLASLt's "
            "picks; error = |ln(model's top-1 µs / measured µs)|\n")
    cols = list(s.columns)
    return head + render_table(cols, ([cell(v, ".3f" if isinstance(v, float) and "err" in c or "over" in c
                                            else "") for c, v in zip(cols, r)] for r in s.itertuples(index=False)))


COMMANDS = [nvmmh_cmd]
