"""Palette, colour fields, peak rates and titles shared by the plots."""
from __future__ import annotations

import pandas as pd

from cublaslt_probe.errors import OptionError
from cublaslt_probe.vocab import gpu_peaks


def peak_source(gpu: str | None) -> str:
    """Where the peaks of `gpu` come from (`vocab.PEAKS`), or that they are unknown."""
    p = gpu_peaks(gpu)
    return p.describe() if p else f"peak unknown for {gpu or 'this GPU'}"


def palette(n: int) -> list:
    """`n` distinct colours: the strong halves of tab20, tab20b, tab20c, then their lighter shades, then
    Dark2 and Set3 (80 in all, repeated beyond that -- cells also carry their legend number)."""
    from matplotlib import colormaps
    t20 = list(colormaps["tab20"].colors)
    t20b = list(colormaps["tab20b"].colors)
    t20c = list(colormaps["tab20c"].colors)
    order = (t20[0::2] + t20b[0::4] + t20c[0::4] + t20[1::2] + t20b[2::4] + t20c[2::4]
             + t20b[1::4] + t20c[1::4] + t20b[3::4] + t20c[3::4]
             + list(colormaps["Dark2"].colors) + list(colormaps["Set3"].colors))
    return [order[i % len(order)] for i in range(n)]


def text_color(rgb) -> str:
    r, g, b = rgb[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


COLOR_FIELDS = ("kernel", "tile", "cluster", "family", "split_k")


def _pair(a, b) -> pd.Series:
    out = a.astype("string") + "x" + b.astype("string")
    return out.where(a.notna() & b.notna())


def color_values(df: pd.DataFrame, field: str) -> tuple[pd.Series, dict]:
    """(value per row, {value: legend label}) for a colour field.

    ``kernel`` (the full name, labelled by its decoded short form, made unique where two kernels share one),
    ``tile`` (tile_m x tile_n), ``cluster``, ``family``, ``split_k``, or any other dataset column.
    Rows that did not run (``error``) get NA.
    """
    ok = df["error"].isna() if "error" in df else pd.Series(True, index=df.index)
    if field == "kernel":
        _need(df, ["kernel"], field)
        vals = df["kernel"].astype("string")
        labels = kernel_labels(df.loc[ok & vals.notna()])
    elif field == "tile":
        _need(df, ["tile_m", "tile_n"], field)
        vals = _pair(df["tile_m"], df["tile_n"])
        if "kernel" in df:   # gemv / gemmSN / legacy kernels write no tile: name them
            kl = kernel_labels(df.loc[vals.isna() & df["kernel"].notna()])
            vals = vals.fillna(df["kernel"].astype("string").map(kl).astype("string"))
        labels = {}
    elif field == "cluster":
        _need(df, ["cluster_m", "cluster_n"], field)
        vals = _pair(df["cluster_m"], df["cluster_n"]).fillna("no cluster in name")
        labels = {}
    elif field == "split_k":
        _need(df, ["split_k"], field)
        s = df["split_k"].astype("boolean")
        vals = pd.Series(pd.NA, index=df.index, dtype="string")
        vals[s.fillna(False).astype(bool)] = "split-K"
        vals[(~s).fillna(False).astype(bool)] = "no split-K"
        vals = vals.fillna("name silent on split-K")
        labels = {}
    else:
        _need(df, [field], field)
        vals = df[field].astype("string")
        labels = {}
    vals = vals.where(ok)
    for v in vals.dropna().unique():
        labels.setdefault(v, str(v))
    return vals, labels


def _need(df, cols, field):
    missing = [c for c in cols if c not in df.columns]
    if missing:
        known = ", ".join(COLOR_FIELDS)
        raise OptionError(f"cannot colour by {field!r}: the dataset has no column {', '.join(missing)}. Choose "
                         f"{known}, or a dataset column ({', '.join(str(c) for c in df.columns if c != 'nk')})")


def config_labels(df: pd.DataFrame) -> pd.Series:
    """Per row: the kernel's configuration as people read it -- the decoded short form, prefixed by the
    family when it is not nvjet (``cutlass 128x128``, ``xmma 64x256 · 8x3``, ``256x128 · 64x4 · 1x2 · coopA``)."""
    def text(v) -> str:
        return "" if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)
    fam = [text(f) for f in df["family"]] if "family" in df else [""] * len(df)
    shorts = df["kernel_short"] if "kernel_short" in df else pd.Series(pd.NA, index=df.index)
    short = [text(s) or text(k) for s, k in zip(shorts, df["kernel"])]
    return pd.Series([s if f in ("nvjet", "unknown", "") or f.lower() in s.lower() else f"{f} {s}"
                      for f, s in zip(fam, short)], index=df.index, dtype=object)


def kernel_labels(df: pd.DataFrame) -> dict:
    """{kernel name: legend label}: the decoded short form, prefixed by the family for non-nvjet kernels
    (``cutlass 64x64``), and made unique where two kernels share it by the name tokens that differ
    (``64x64 (bf16_s1688gemm)``), else by a counter."""
    from cublaslt_probe.names import decode
    names = list(dict.fromkeys(df["kernel"].dropna().astype(str)))
    kns = {k: decode(k) for k in names}
    labels = {}
    for k, kn in kns.items():
        lab = kn.short or k
        if "::" in (kn.base or "") and lab == kn.base.rsplit("::", 1)[-1]:   # "kernel" -> "gemvx::kernel"
            lab = "::".join(kn.base.split("::")[-2:])
        if kn.family not in ("nvjet", "unknown") and kn.family.lower() not in lab.lower():
            lab = f"{kn.family} {lab}"
        labels[k] = lab
    by_label: dict[str, list[str]] = {}
    for k, lab in labels.items():
        by_label.setdefault(lab, []).append(k)
    for lab, ks in by_label.items():
        if len(ks) < 2:
            continue
        toks = [(list(kns[k].tokens) or [k]) + [f"<{a}>" for a in kns[k].template_args] for k in ks]
        if len({len(t) for t in toks}) == 1:   # aligned tokens: keep the positions that differ
            diff = [i for i in range(len(toks[0])) if len({t[i] for t in toks}) > 1]
            mids = [" ".join(t[i] for i in diff) for t in toks]
        else:                                  # else the span between the common prefix and suffix
            pre = 0
            while all(len(t) > pre for t in toks) and len({t[pre] for t in toks}) == 1:
                pre += 1
            suf = 0
            while all(len(t) - pre > suf for t in toks) and len({t[len(t) - 1 - suf] for t in toks}) == 1:
                suf += 1
            mids = ["_".join(t[pre:len(t) - suf]) for t in toks]
        unique = len(set(mids)) == len(mids)
        for i, (k, mid) in enumerate(zip(ks, mids), 1):
            if unique:
                labels[k] = f"{lab} ({mid if len(mid) <= 24 else mid[:21] + '...'})" if mid else lab
            else:
                labels[k] = f"{lab} (#{i})"
    return labels


def title_head(env: dict) -> str:
    """``NVIDIA H200 · cuBLASLt 13.1.0``"""
    gpu = env.get("gpu") or "unknown GPU"
    ver = env.get("cublaslt_version")
    return f"{gpu} · cuBLASLt {ver}" if ver else str(gpu)
