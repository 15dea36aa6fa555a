"""`map`, `plot`, `report`: pictures of a dataset (CPU only). DATASET defaults to the shipped H200 dataset."""
from __future__ import annotations

import os

import click

from cublaslt_probe.cli._common import check_dataset_file, check_writable, check_writable_dir, suffix_format
from cublaslt_probe.vocab import IMAGE_FORMATS

_AXES = "m, n, k, batch, nk (the (n, k) pair), backend, op, dtype, layout"


def _agg():
    import matplotlib
    matplotlib.use("Agg")


def _filters(f):
    """The options that pin rows: --dtype --layout --backend --op --m --n --k --batch."""
    opts = [
        click.option("--batch", type=int, default=None, help="Pin batch (default: 1 when cells hold several)."),
        click.option("--k", type=int, default=None,
                     help="Pin K (default: 4096, else the most common K, when cells would hold several)."),
        click.option("--n", type=int, default=None, help="Pin N (when N is not an axis)."),
        click.option("--m", type=int, default=None, help="Pin M (when M is not an axis)."),
        click.option("--op", default=None, help="mm, addmm, bmm, scaled_mm (default: mm, else the most common)."),
        click.option("--backend", default=None, help="torch, torch-lt, lt, cupy (default: torch when present)."),
        click.option("--layout", default=None, help="NN, NT, TN, TT (default: NT when present)."),
        click.option("--dtype", default=None, help="fp32, tf32, fp16, bf16, fp8 (default: bf16 when present)."),
        click.option("--y", "y", default="auto", show_default=True,
                     help=f"Y axis: {_AXES}; auto picks n for a grid at fixed K, nk for weight shapes, "
                          "backend for square sweeps."),
        click.option("--x", "x", default="m", show_default=True, help=f"X axis: {_AXES}."),
    ]
    for o in opts:
        f = o(f)
    return f


def _load(dataset):
    """The dataset; says which one when it is the shipped default, and what a wrong file is."""
    from cublaslt_probe.render import plots
    if dataset is None:
        from cublaslt_probe.render.plots.select import default_dataset
        click.echo(f"dataset: {default_dataset()} (the shipped default; give DATASET for another)", err=True)
    else:
        check_dataset_file(dataset)
    return plots.load(dataset)


def _check_image(out: str) -> None:
    if suffix_format(out, IMAGE_FORMATS) is None:
        raise click.UsageError(f"-o {out}: give an image file ending in .png, .svg or .pdf")
    check_writable(out)


def _save(fig, out: str, dpi: int) -> str:
    from cublaslt_probe.render import plots
    fmt = plots.save(fig, out, dpi=dpi)
    return fmt


def _pins(kw: dict) -> dict:
    return {c: kw[c] for c in ("dtype", "layout", "backend", "op", "m", "n", "k", "batch")}


@click.command("map")
@click.argument("dataset", required=False, type=click.Path(dir_okay=False))
@click.option("-o", "--output", "--out", "out", default="map.png", show_default=True,
              type=click.Path(dir_okay=False), help="Image to write: .png, .svg or .pdf.")
@_filters
@click.option("--color", default="kernel", show_default=True,
              help="Colour by: kernel, tile, cluster, family, split_k, or any dataset column (stages, algo_id…).")
@click.option("--no-numbers", is_flag=True, help="Do not write legend numbers into the cells.")
@click.option("--dpi", default=120, show_default=True, help="Resolution of PNG output.")
def map_cmd(dataset, out, x, y, color, no_numbers, dpi, **kw):
    """Shape→kernel map: which kernel each shape got, as a categorical heatmap over two shape axes.

    Every other identifying column is pinned so that each cell holds one GEMM (the defaults are listed
    with the options below); the title says what was pinned. Example:

        cublaslt-probe map --dtype bf16 --layout NT --backend torch -o map.png

    DATASET: a dataset .parquet (`sweep` or `dataset` writes one). Default: the shipped H200 grid,
    data/h200_grid.parquet (in the checkout, the installed package, or the folder CUBLASLT_PROBE_DATA names).
    """
    _check_image(out)
    _agg()
    from cublaslt_probe.render import plots
    df = _load(dataset)
    fig = plots.kernel_map(df, x, y, color=color, annotate=not no_numbers, **_pins(kw))
    fmt = _save(fig, out, dpi)
    info = getattr(fig, "_cublaslt_probe", {})
    click.echo(f"wrote {out} ({fmt}): {info.get('cells', '?')} shapes ({info.get('axes', '?')}), "
               f"{info.get('values', '?')} distinct {color} values", err=True)


PLOT_KINDS = ("tflops", "heuristic", "regret", "pathdiff")


@click.command("plot")
@click.argument("kind", type=click.Choice(PLOT_KINDS))
@click.argument("dataset", required=False, type=click.Path(dir_okay=False))
@click.option("-o", "--output", "--out", "out", default=None, type=click.Path(dir_okay=False),
              help="Image to write: .png, .svg or .pdf (default: KIND.png).")
@_filters
@click.option("--peak", type=click.FloatRange(min=0, min_open=True), default=None,
              help="tflops: peak TFLOP/s for the % scale (default: the H100/H200 datasheet dense peak of the dtype).")
@click.option("--pct", is_flag=True, help="tflops: write % of peak in the cells instead of TFLOP/s.")
@click.option("--other", type=click.Path(dir_okay=False), default=None,
              help="pathdiff: a second dataset (another GPU or library version) to compare with.")
@click.option("--a", "a", default=None, help="pathdiff: backend of side A (default torch).")
@click.option("--b", "b", default=None, help="pathdiff: backend of side B (default torch-lt; with --other, A's).")
@click.option("--dpi", default=120, show_default=True, help="Resolution of PNG output.")
def plot_cmd(kind, dataset, out, x, y, peak, pct, other, a, b, dpi, **kw):
    """Companion plots over the same axes as `map`.

    \b
    tflops     achieved TFLOP/s per shape, % of peak on the colour bar
    heuristic  heuristic miss/hit µs per dtype and against the x axis (filters optional; --y unused)
    regret     time over the best heuristic candidate (datasets swept with candidates)
    pathdiff   where torch and torch-lt (--a/--b), or two datasets (--other), pick different kernels

    DATASET: a dataset .parquet (`sweep` or `dataset` writes one). Default: the shipped H200 grid,
    data/h200_grid.parquet (in the checkout, the installed package, or the folder CUBLASLT_PROBE_DATA names).
    """
    out = out or f"{kind}.png"
    _check_image(out)
    _agg()
    from cublaslt_probe.render import plots
    df = _load(dataset)
    pins = _pins(kw)
    if kind == "tflops":
        fig = plots.tflops_map(df, x, y, peak=peak, annotate="pct" if pct else "tflops", **pins)
    elif kind == "heuristic":
        pins.pop("batch")
        fig = plots.heuristic_plot(df, x, **pins)
    elif kind == "regret":
        fig = plots.regret_map(df, x, y, **pins)
    else:
        if pins.get("backend"):
            raise click.UsageError("pathdiff compares two backends: give them with --a and --b, not --backend")
        pins.pop("backend")
        if y == "auto":
            from cublaslt_probe.render.plots.select import auto_axes
            if auto_axes(df)[1] == "backend":  # a square sweep's natural y is what pathdiff compares
                y = "dtype"
        df_b = _load(other) if other else None
        fig = plots.pathdiff_map(df, df_b, x, y, a=a, b=b, **pins)
    fmt = _save(fig, out, dpi)
    click.echo(f"wrote {out} ({fmt})", err=True)


@click.command("report")
@click.argument("dataset", required=False, type=click.Path(dir_okay=False))
@click.option("-o", "--output", "--out", "out", default="report", show_default=True, type=click.Path(),
              help="The page to write (OUT.html), or a directory to write index.html into (created if needed).")
@click.option("--backend", default=None, help="Backend of the per-dtype maps (default: torch when present).")
@click.option("--dpi", default=90, show_default=True, help="Resolution of the embedded images.")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
def report_cmd(dataset, out, backend, dpi, quiet):
    """One self-contained HTML page (images embedded): environment, coverage, maps per dtype × layout,
    path differences, top kernels, cliffs, heuristic overhead, log/kernel consistency.

    DATASET: a dataset .parquet (`sweep` or `dataset` writes one). Default: the shipped H200 grid,
    data/h200_grid.parquet (in the checkout, the installed package, or the folder CUBLASLT_PROBE_DATA names).
    """
    if suffix_format(out, ("html",)) == "html":
        check_writable_dir(os.path.dirname(os.path.abspath(out)))
        check_writable(out)
    else:
        check_writable_dir(out)
    _agg()
    from cublaslt_probe.render.report import build_report
    df = _load(dataset)
    if not quiet:
        click.echo(f"report on {df.attrs.get('source')}: {len(df):,} rows", err=True)
    path = build_report(df, out, progress=None if quiet else (lambda line: click.echo(line, err=True)),
                        backend=backend, dpi=dpi)
    size = path.stat().st_size / 1e6
    click.echo(f"wrote {path} ({size:.1f} MB)", err=True)


COMMANDS = [map_cmd, plot_cmd, report_cmd]
