"""Pictures of a dataset: shape→kernel maps and their companions. DataFrame in, matplotlib Figure out.

    >>> from cublaslt_probe.render import plots
    >>> df = plots.load()                       # the shipped H200 dataset
    >>> fig = plots.kernel_map(df, x="m", y="n", dtype="bf16", layout="NT", backend="torch", k=4096)
    >>> fig.savefig("map.png")                  # the caller saves; plot functions never show or save

Figures are built with `matplotlib.figure.Figure` (no pyplot), so importing this needs no GUI backend.
See docs/plots.md.
"""
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.render.plots.heuristic import heuristic_plot
from cublaslt_probe.render.plots.maps import (
    REGRET_COLUMNS,
    diff_map,
    kernel_map,
    pathdiff_map,
    pathdiff_table,
    regret_map,
    tflops_map,
)
from cublaslt_probe.render.plots.select import (
    AXES,
    Selection,
    auto_axes,
    default_dataset,
    env_of,
    load,
    require_columns,
    select,
)
from cublaslt_probe.render.plots.style import COLOR_FIELDS, config_labels, kernel_labels, peak_source
from cublaslt_probe.vocab import IMAGE_FORMATS, MEASURED_TFLOPS, peak_tflops

__all__ = ["kernel_map", "tflops_map", "regret_map", "pathdiff_map", "pathdiff_table", "diff_map", "heuristic_plot",
           "select", "Selection", "auto_axes", "default_dataset", "load", "env_of", "require_columns", "AXES",
           "config_labels", "kernel_labels", "COLOR_FIELDS", "REGRET_COLUMNS", "MEASURED_TFLOPS",
           "peak_tflops", "peak_source", "save"]


def save(fig, path, dpi: int = 120) -> str:
    """Write `fig` to `path`; the format comes from the extension (png, svg, pdf). Returns the format."""
    import os

    ext = os.path.splitext(str(path))[1].lower().lstrip(".")
    if ext not in IMAGE_FORMATS:
        raise ProbeError(f"cannot write {path}: give a file ending in .png, .svg or .pdf")
    fig.savefig(path, format=ext, dpi=dpi, bbox_inches="tight")
    return ext
