# ---
# Script twin of notebooks/explore.ipynb (percent format: each "# %%" starts a cell). CI runs this file;
# tests/test_notebook.py checks that the notebook's code cells are exactly these cells.
# Re-execute the notebook with: jupyter nbconvert --to notebook --execute --inplace notebooks/explore.ipynb
# ---

# %% [markdown]
# # Exploring the shipped H200 dataset
#
# Which cuBLAS/cuBLASLt kernel ran for each GEMM shape on an NVIDIA H200, how fast, and where the two torch
# paths disagree. Everything here runs on a CPU: it reads the dataset file through the package API
# (`cublaslt_probe.render.plots` and `cublaslt_probe.render.report`); nothing touches a GPU.

# %%
import os

import pandas as pd

from cublaslt_probe.render import plots, report

try:  # in Jupyter, show the figures inline; as a script, nothing to do
    get_ipython().run_line_magic("matplotlib", "inline")  # noqa: F821
    get_ipython().run_line_magic("config", "InlineBackend.print_figure_kwargs = {'dpi': 72, 'bbox_inches': 'tight'}")  # noqa: F821
except NameError:
    pass

pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 20)

df = plots.load()   # data/h200_grid.parquet when shipped, else data/h200_llm.parquet
env = plots.env_of(df)
print(f"{os.path.basename(df.attrs['source'])}: {len(df):,} GEMMs")
print(f"{env.get('gpu')} · {env.get('sm_count')} SMs · driver {env.get('driver')} · "
      f"cuBLASLt {env.get('cublaslt_version')} · torch {env.get('torch_version')}")
report.coverage(df)

# %% [markdown]
# ## The shape → kernel map
#
# One colour per kernel, numbered in the legend in the order it first appears from left to right (small M
# first); black lines mark where the choice changes. `auto_axes` picks the natural axes of the dataset:
# M × N at fixed K for a grid, M × (N, K) weight shapes for the `llm` preset.

# %%
x, y = plots.auto_axes(df)
print("axes:", x, "×", y)
fig = plots.kernel_map(df, x, y, dtype="bf16", layout="NT", backend="torch")
fig

# %% [markdown]
# The same shapes coloured by tile only (tile_m × tile_n), and the TFLOP/s each shape reached, with the
# kernel changes drawn on top so cliffs can be matched to the choice.

# %%
fig = plots.kernel_map(df, x, y, dtype="bf16", layout="NT", backend="torch", color="tile")
fig

# %%
fig = plots.tflops_map(df, x, y, dtype="bf16", layout="NT", backend="torch")
fig

# %% [markdown]
# ## Which tile does bf16 NT pick for decode shapes?
#
# Decode steps multiply a few tokens (M ≤ 64) by a weight (N ≥ 1024 output features; K fixed by the model).
# For each M, the tiles torch's default path (cuBLAS) ran over those weight shapes, and how often the
# kernel splits K. Tiles are as the kernel name writes them, in cuBLAS's column-major frame (cuBLAS's m is
# torch's N: for nvjet, `tile_m` runs along torch's N and `tile_n` along torch's M).

# %%
bf16 = df[(df["dtype"] == "bf16") & (df["layout"] == "NT") & (df["op"] == "mm") & (df["backend"] == "torch")
          & df["error"].isna()]
decode = bf16[(bf16["m"] <= 64) & (bf16["n"] >= 1024)]
decode = decode.assign(tile=decode["tile_m"].astype(str) + "x" + decode["tile_n"].astype(str),
                       config=plots.config_labels(decode))
tiles = (decode.groupby("m")
         .agg(shapes=("tile", "size"), tiles=("tile", lambda s: ", ".join(s.value_counts().index[:3])),
              split_k_pct=("split_k", lambda s: round(100 * s.fillna(False).astype(bool).mean())),
              median_tflops=("tflops", "median")))
tiles

# %%
top = decode["config"].value_counts().head(5)
print("most frequent decode kernels (bf16 NT, torch):")
for cfg, n in top.items():
    print(f"  {n:3d} shapes  {cfg}")
narrow = decode["tile_n"].dropna().astype(int)
print(f"tile_n ≤ 16 in {100 * (narrow <= 16).mean():.0f} % of decode shapes; "
      f"split-K in {100 * decode['split_k'].fillna(False).astype(bool).mean():.0f} %")

# %% [markdown]
# ## Where do torch and torch-lt differ?
#
# `torch` goes through cuBLAS (`cublasGemmEx`), `torch-lt` through cuBLASLt with a 1 MiB workspace; both
# ask the same heuristic, so differences come from the workspace limit and the request. Per op × dtype ×
# layout: how many GEMMs chose different kernels, and what that did to TFLOP/s.

# %%
report.path_summary(df, "torch", "torch-lt")

# %%
fig = plots.pathdiff_map(df, x=x, y=y, a="torch", b="torch-lt", dtype="bf16", layout="NT")
fig

# %%
diff = plots.pathdiff_table(df, "torch", "torch-lt")
diff = diff.assign(change_pct=100 * (diff["tflops_torch-lt"] / diff["tflops_torch"] - 1))
diff.reindex(diff["change_pct"].abs().sort_values(ascending=False).index).head(8)[
    ["op", "dtype", "layout", "m", "n", "k", "kernel_short_torch", "kernel_short_torch-lt", "change_pct"]]

# %% [markdown]
# ## Where are the cliffs?
#
# Neighbouring shapes whose TFLOP/s differ by more than 20 % in a way that size does not explain: the larger
# shape runs at fewer TFLOP/s ("TFLOP/s falls") or in less time ("time falls"), with the kernels on each side.

# %%
cliffs = report.find_cliffs(df)
print(f"{len(cliffs)} cliffs; the kernel changes across {int(cliffs['kernel changed'].sum())} of them")
print(cliffs.groupby("kind").size().to_string())
cliffs.head(10)

# %% [markdown]
# ## What does the heuristic cost?
#
# Host time of `cublasLtMatmulAlgoGetHeuristic` with the cache off (a miss, paid once per new problem) and
# warm (a hit), against the GEMM itself.

# %%
report.heuristic_summary(df)

# %%
fig = plots.heuristic_plot(df, x="m")
fig
