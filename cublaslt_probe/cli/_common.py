"""Small helpers shared by the command modules."""
from __future__ import annotations

import json
import math
import os

import click

from cublaslt_probe.errors import ProbeError


def check_writable(output: str | None) -> None:
    """Fail before reading a large input, not after, when the output cannot be written."""
    if not output or output == "-":
        return
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise ProbeError(f"cannot write {output}: no such directory {parent}")
    if not os.access(parent, os.W_OK):
        raise ProbeError(f"cannot write {output}: permission denied")


def json_default(v):
    """JSON for what json.dumps does not know: timestamps, numpy scalars, anything else as text."""
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return str(v)


def clean(v):
    """pandas missing values (NA, NaN, NaT) -> None, numpy scalars -> Python, for JSON."""
    import pandas as pd
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item") and not hasattr(v, "isoformat"):
        return v.item()
    return v


def write_text(output: str | None, text: str) -> None:
    """`text` to stdout (no output, or `-`) or to the file `output`."""
    if not output or output == "-":
        click.echo(text, nl=False)
        return
    try:
        with open(output, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    except OSError as e:
        raise ProbeError(f"cannot write {output}: {e.strerror or e}") from e


def write_frame(df, kind: str, output: str | None, table) -> None:
    """`df` as table (`table()` renders the people's view), csv, jsonl or parquet (needs `output`)."""
    if kind == "table":
        write_text(output, table())
    elif kind == "csv":
        write_text(output, df.to_csv(index=False))
    elif kind == "jsonl":
        cols = list(df.columns)
        lines = [json.dumps(dict(zip(cols, map(clean, row))), ensure_ascii=False, default=json_default)
                 for row in df.itertuples(index=False, name=None)]
        write_text(output, "".join(line + "\n" for line in lines))
    else:  # parquet
        try:
            df.to_parquet(output, index=False)
        except OSError as e:
            raise ProbeError(f"cannot write {output}: {e.strerror or e}") from e
