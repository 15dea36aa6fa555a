"""Raw probe records -> one tidy table (one row per backend, op, dtype, layout, shape) -> Parquet.

CPU only. The schema lives here (`SCHEMA`, documented in docs/dataset.md) and `validate(df)` checks it.
Each row joins three independent pieces of evidence for one GEMM:
- the kernels the profiler saw (`kernels`; `kernel` is the main GEMM kernel) and their decoded fields,
- the algo cuBLASLt logged for that call (`algo_*`, from its level-2 trace line),
- the measurements (`time_us`, `tflops`, `heuristic_miss_us`, `heuristic_hit_us`).
`consistent` says whether the first two agree on tile, cluster and split-K.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pandas as pd

from cublaslt_probe.analysis.evidence import consistency, log_matches_case, main_kernel, trace_record
from cublaslt_probe.errors import ProbeError, SchemaError
from cublaslt_probe.raw_record import REQUIRED, RawRecord
from cublaslt_probe.streams import complete_lines, cut_note, open_text
from cublaslt_probe.vocab import DECODED_COLUMNS, ENV_KEYS, ENV_MATCH

log = logging.getLogger(__name__)

ENV_COLUMNS = list(ENV_KEYS)

# column -> (pandas dtype, meaning). Integers are nullable (Int64); repeated strings are categories.
SCHEMA: dict[str, tuple[str, str]] = {
    "gpu": ("category", "GPU name as the driver reports it"),
    "sm_count": ("Int64", "streaming multiprocessors"),
    "driver": ("category", "NVIDIA driver version"),
    "cuda_runtime": ("category", "CUDA runtime version torch was built with"),
    "cublaslt_version": ("category", "version of the libcublasLt instance the process loaded (cublasLtGetVersion)"),
    "torch_version": ("category", "torch version"),
    "cupy_version": ("category", "cupy version (null when cupy is not installed)"),
    "key": ("string", "backend|op|dtype|layout|m|n|k|batch: the row's identity"),
    "backend": ("category", "torch (cuBLAS path), torch-lt (cuBLASLt path), cupy, lt (direct cuBLASLt), "
                            "numpy (CPU test backend)"),
    "op": ("category", "mm, bmm, addmm (bias epilogue, = F.linear with bias), scaled_mm (fp8)"),
    "dtype": ("category", "fp32, tf32, fp16, bf16, fp8 (e4m3 x e4m3), fp8_e5m2 (e5m2 x e4m3); fp8 output is bf16"),
    "layout": ("category", "torch view: NN = A m×k, B k×n, both contiguous; a T = that operand stored transposed "
                           "(NT = F.linear)"),
    "m": ("Int64", "torch view: rows of A and C"),
    "n": ("Int64", "torch view: columns of B and C"),
    "k": ("Int64", "torch view: reduction dimension"),
    "batch": ("Int64", "batch count (bmm), 1 otherwise"),
    "blas_m": ("Int64", "column-major problem cuBLAS received: m (= torch n)"),
    "blas_n": ("Int64", "column-major problem: n (= torch m)"),
    "blas_k": ("Int64", "column-major problem: k"),
    "blas_trans_a": ("category", "cuBLAS op(A): N or T (= torch layout's second letter)"),
    "blas_trans_b": ("category", "cuBLAS op(B): N or T (= torch layout's first letter)"),
    "kernel": ("string", "main GEMM kernel: the first launched kernel of a GEMM family (else the first kernel)"),
    "kernels": ("object", "every kernel launched by the GEMM, in launch order (list of str)"),
    "n_kernels": ("Int64", "len(kernels)"),
    **DECODED_COLUMNS,
    "log_function": ("category", "function of the logged trace line (cublasLtMatmul, cublasLtTSTMatmul, ...)"),
    "algo_id": ("Int64", "logged algoId"),
    "algo_tile": ("string", "logged tile, e.g. 256x128 (null when the log omits it)"),
    "algo_stages": ("string", "logged stages, e.g. 64xAUTO"),
    "algo_cluster": ("string", "logged cluster shape, e.g. 1x2x1"),
    "algo_split_k": ("Int64", "logged numSplitsK (1 when absent)"),
    "algo_reduction_scheme": ("string", "logged reductionScheme"),
    "algo_custom_option": ("Int64", "logged customOption (0 when absent)"),
    "algo_cta_swizzling": ("Int64", "logged CTA swizzling"),
    "workspace_bytes": ("Int64", "workspace size passed with the logged call"),
    "epilogue": ("string", "logged epilogue (null = default)"),
    "time_us": ("float64", "median GPU time of one GEMM, µs (CUDA events): one call of a back-to-back "
                           "run (L2 warm), or one call after an L2 flush (sweep --flush-l2)"),
    "time_us_min": ("float64", "fastest sample, µs"),
    "time_us_first": ("float64", "median time of the first call after an event boundary (as after another "
                                 "kernel), µs; equals time_us where a sample is one call"),
    "time_reps": ("Int64", "timing samples behind time_us"),
    "time_calls_per_rep": ("Int64", "back-to-back calls per timing sample (a sample is their time over this)"),
    "time_gap_us": ("float64", "GPU idle time between the back-to-back timing samples, µs in all (near 0 = the "
                               "events bracketed the GEMM, not the host's launch gap; null with an L2 flush)"),
    "time_behind": ("Int64", "timing samples (batches) the GPU reached before the host had enqueued all of "
                             "them (0 = every batch was queued ahead of the GPU: no event bracketed a launch "
                             "gap; null with an L2 flush or in captures made before this check)"),
    "kernel_time_us": ("float64", "sum of the kernels' own durations in the profiled call (CUPTI), µs"),
    "tflops": ("float64", "2·m·n·k·batch / time_us / 1e6"),
    "heuristic_miss_us": ("float64", "cublasLtMatmulAlgoGetHeuristic host time with the heuristics cache off, "
                                     "µs (median)"),
    "heuristic_hit_us": ("float64", "same with the cache on and warm, µs (median)"),
    "heuristic_shared": ("Int64", "GEMMs of the window sharing this heuristic measurement (same problem and "
                                  "workspace limit, e.g. torch, cupy and lt of one shape)"),
    "lt_algo_tile": ("string", "lt backend: tile of the algo it ran (from the algo config)"),
    "lt_waves": ("float64", "lt backend: the heuristic's wavesCount for that algo"),
    "error": ("string", "why this GEMM produced no measurement (null when it ran)"),
    "n_candidates": ("Int64", "heuristic candidates run for this GEMM (sweep --candidates; lt backend), else null"),
    "regret_pct": ("float64", "time(candidate #0) / time(fastest correct candidate) - 1, in %"),
    "best_rank": ("Int64", "rank of the fastest candidate (0 = the heuristic's pick)"),
    "best_kernel": ("string", "main kernel of the fastest candidate"),
    "noise_pct": ("float64", "|t1/t2 - 1| of two medians of candidate #0 (the noise evidence), in %"),
    "candidates": ("string", "JSON list of the candidates: config, waves, time, kernel"),
    "log_matches_case": ("boolean", "the logged call is the one asked for: compute type matches fp32/tf32 and the "
                                    "function the backend's path (null: no log line)"),
    "consistent": ("boolean", "decoded kernel agrees with the logged algo on tile, cluster and split-K "
                              "(null: no log line or nothing to compare)"),
    "known_issue": ("string", "the cuBLAS release-note bugs the logged algo config (with the kernel that ran) meets or "
                              "can meet on the row's cuBLAS and compute capability, and the fixing version "
                              "(known_issues; null: none, or no logged algo)"),
}
COLUMNS = list(SCHEMA)
# The raw record's fields (`raw_record.RawRecord`) no column reads: a grouped GEMM's groups (in its `key`), sizes
# and their summary; the probe's own step times; where the heuristic was measured and what it refused; why the
# candidates could not run; keys of other versions. `build_rows` reads every other field (tests/test_raw_record.py).
RAW_NOT_READ = ("groups", "sizes", "group_sizes", "group_summary", "probe_ms", "candidates_error", "heuristic_where",
                "heuristic_error", "extra")


@dataclass
class RawStats:
    """What reading raw files found: records kept, duplicates replaced (the later record of a key wins),
    lines that are not records, and where a file was cut off."""

    files: list[str] = field(default_factory=list)
    lines: int = 0
    records: int = 0
    duplicates: int = 0
    unreadable: int = 0
    examples: list[str] = field(default_factory=list)
    cut: list[tuple[str, str]] = field(default_factory=list)

    def bad(self, where: str, why: str) -> None:
        self.unreadable += 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {why}")

    @property
    def complete(self) -> bool:
        return not self.unreadable and not self.cut


def _record_problem(obj) -> str | None:
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, not a record"
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        return f"not a probe record (no {', '.join(missing)})"
    wrong = [k for k, t in REQUIRED.items() if not isinstance(obj[k], t) or isinstance(obj[k], bool)]
    if wrong:
        return f"not a probe record ({', '.join(wrong)} of the wrong type)"
    return None


def _scan_raw(path, st: RawStats) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of every env line and probe record of a raw file (JSONL, gzip detected by
    its first bytes), in order; a line that is not one (a truncated last line, garbage) is counted in
    `st`, and a gzip cut off part way ends the scan (noted in `st`): nothing readable is lost."""
    with open_text(path, newline="\n") as f:
        i = 0
        try:
            for i, line in enumerate(complete_lines(f), 1):
                st.lines += 1
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    st.bad(f"{path}:{i}", "not JSON (a sweep cut off mid-write?)")
                    continue
                if isinstance(obj, dict) and obj.get("type") == "env":
                    yield i, obj
                    continue
                why = _record_problem(obj)
                if why:
                    st.bad(f"{path}:{i}", why)
                    continue
                yield i, obj
        except OSError as e:
            st.cut.append((str(path), f"cut off after line {i:,} ({e}): the records before it are kept"))
        else:
            why = cut_note(f)
            if why:
                st.cut.append((str(path), f"cut off after line {i:,} ({why}): the records before it are kept"))


def _env_of(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k != "type"}


def read_raw(path: str | os.PathLike, stats: RawStats | None = None) -> tuple[dict, list[dict]]:
    """Read a raw sweep file: returns (env, records).

    The first line may be an env record (`{"type": "env", ...}`); a later record with the same key
    replaces an earlier one (resume re-runs a window that was cut off). Never loses a readable record to
    a bad line (see `_scan_raw`; what was skipped is counted in `stats`).
    """
    st = stats if stats is not None else RawStats()
    st.files.append(str(path))
    env: dict = {}
    recs: dict[str, dict] = {}
    for _, obj in _scan_raw(path, st):
        if obj.get("type") == "env":
            env = _env_of(obj)
            continue
        if obj["key"] in recs:
            st.duplicates += 1
            del recs[obj["key"]]  # the later record wins, in its own place
        recs[obj["key"]] = obj
    st.records += len(recs)
    return env, list(recs.values())


def _check_env(p, env: dict, seen: list[tuple[str, dict]], allow_env_mismatch: bool) -> None:
    for q, other in seen:
        diff = [k for k in ENV_MATCH if env.get(k) != other.get(k)]
        if diff and not allow_env_mismatch:
            what = "; ".join(f"{k} {other.get(k)} vs {env.get(k)}" for k in diff)
            raise ProbeError(f"{p} was measured in another environment than {q} ({what}): build one "
                             "dataset per environment, or pass --allow-env-mismatch to keep each "
                             "row's own environment")


def _shared(envs: list[tuple[str, dict]]) -> dict:
    shared = dict(envs[0][1]) if envs else {}
    for _, e in envs[1:]:
        shared = {k: v for k, v in shared.items() if e.get(k) == v}
    return shared


def _stamp(r: dict, env: dict) -> dict:
    for c in ENV_COLUMNS:
        if r.get(c) is None and env.get(c) is not None:
            r[c] = env[c]
    return r


def read_raws(paths: list, env_override: dict | None = None, allow_env_mismatch: bool = False,
              stats: RawStats | None = None) -> tuple[dict, list[dict]]:
    """Read several raw files into one set of records, each carrying the environment of its own file.

    Files measured in different environments (`ENV_MATCH`: GPU, cuBLASLt, torch, driver) are refused, as
    `merge` refuses such parts, unless `allow_env_mismatch`; either way every record keeps its file's
    environment in its env columns, never another file's. `env_override` (an env.json) is the
    environment of files that have no env line. A key in several files: the later file's record wins
    (counted in ``stats.duplicates``). Returns (the environment the files share, records).
    """
    st = stats if stats is not None else RawStats()
    envs: list[tuple[str, dict]] = []
    recs: dict[str, dict] = {}
    for p in paths:
        env, rs = read_raw(p, st)
        env = env or dict(env_override or {})
        if env:
            _check_env(p, env, envs, allow_env_mismatch)
            envs.append((str(p), env))
        for r in rs:
            _stamp(r, env)
            if r["key"] in recs:
                st.duplicates += 1
                st.records -= 1
                del recs[r["key"]]
            recs[r["key"]] = r
    return _shared(envs), list(recs.values())


# --- the one core of every raw -> Parquet writer (the `dataset` command here; `merge` and `sweep` in sweep.py) ----
def record_tables(records: Iterable[dict], env: dict | None, schema, batch: int = 8192):
    """Raw records as (Arrow table of the dataset `schema`, its validated frame), `batch` records at a time
    (`arrow_batch`): the row groups a writer writes. Which records stand for their GEMMs, and the
    environment each carries, is the caller's rule."""
    buf: list[dict] = []
    for r in records:
        buf.append(r)
        if len(buf) >= batch:
            yield arrow_batch(buf, env, schema)
            buf = []
    if buf:
        yield arrow_batch(buf, env, schema)


def rebatch(tables: Iterable, rows: int):
    """Arrow `tables` of one schema joined into tables of `rows` rows at least (the last may hold fewer), so
    that the small tables of many small parts become a few Parquet row groups, not one each."""
    import pyarrow as pa
    buf, held = [], 0
    for t in tables:
        buf.append(t)
        held += len(t)
        if held >= rows:
            yield pa.concat_tables(buf) if len(buf) > 1 else buf[0]
            buf, held = [], 0
    if buf:
        yield pa.concat_tables(buf) if len(buf) > 1 else buf[0]


def write_tables(tables: Iterable, out: str | os.PathLike, schema) -> int:
    """Write Arrow `tables` of `schema` to the Parquet file `out`, whole or not at all: into a temporary file
    beside it, renamed when complete (a failure removes it and leaves `out` as it was). Returns the rows."""
    import pyarrow.parquet as pq
    out = os.fspath(out)
    tmp = os.path.join(os.path.dirname(os.path.abspath(out)), f".{os.path.basename(out)}.{os.getpid()}.tmp")
    rows = 0
    try:
        with pq.ParquetWriter(tmp, schema) as w:
            for t in tables:
                w.write_table(t)
                rows += len(t)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return rows


def write_from_raw(paths: list, out: str | os.PathLike, env_override: dict | None = None,
                   allow_env_mismatch: bool = False, stats: RawStats | None = None,
                   batch: int = 4096) -> tuple[dict, int, dict]:
    """`read_raws` + `build` + `write_parquet` in flat memory: a first pass finds the record that wins for
    each key and checks the environments; a second builds the rows `batch` records at a time and writes
    them as Parquet row groups (`record_tables`, `write_tables`: whole or not at all). Memory holds the keys and one
    batch.
    Returns (the shared environment, rows written, counts: error rows, consistent, comparable); nothing is
    written when no record was found (0 rows)."""
    st = stats if stats is not None else RawStats()
    envs: list[tuple[str, dict]] = []
    file_env: list[dict] = []
    winner: dict[str, tuple[int, int]] = {}
    for fi, p in enumerate(paths):
        st.files.append(str(p))
        env: dict = {}
        for i, obj in _scan_raw(p, st):
            if obj.get("type") == "env":
                env = _env_of(obj)
            elif obj["key"] in winner:
                st.duplicates += 1
                winner[obj["key"]] = (fi, i)
            else:
                winner[obj["key"]] = (fi, i)
        env = env or dict(env_override or {})
        if env:
            _check_env(p, env, envs, allow_env_mismatch)
            envs.append((str(p), env))
        file_env.append(env)
    st.records = len(winner)
    shared = _shared(envs)
    counts = {"error": 0, "consistent": 0, "comparable": 0}
    if not winner:
        return shared, 0, counts
    schema = arrow_schema(shared)

    def winners():
        for fi, p in enumerate(paths):
            for i, obj in _scan_raw(p, RawStats()):
                if obj.get("type") != "env" and winner.get(obj["key"]) == (fi, i):
                    yield _stamp(obj, file_env[fi])

    def tables():
        for table, df in record_tables(winners(), shared, schema, batch):
            counts["error"] += int(df["error"].notna().sum())
            counts["consistent"] += int(df["consistent"].eq(True).sum())
            counts["comparable"] += int(df["consistent"].notna().sum())
            yield table
    rows = write_tables(tables(), out, schema)
    return shared, rows, counts


def build_rows(records: Iterable[dict], env: dict | None = None) -> Iterator[dict]:
    """One dataset row per raw record (a saved raw line, read through `RawRecord.from_dict`), with `env`'s
    columns where the record carries none of its own."""
    from cublaslt_probe.names import decode
    env = env or {}
    for d in records:
        r = RawRecord.from_dict(d)
        kernels = r.kernels
        main = main_kernel(kernels)
        kn = decode(main) if main else None
        rec = trace_record(r.log_lines)
        t = r.time_us
        flops = 2 * r.m * r.n * r.k * r.batch
        cfg = r.lt_config or {}
        row = {c: env.get(c) for c in ENV_COLUMNS}
        row.update({c: r.env[c] for c in ENV_COLUMNS if r.env.get(c) is not None})
        row.update({
            "key": r.key, "backend": r.backend, "op": r.op, "dtype": r.dtype, "layout": r.layout,
            "m": r.m, "n": r.n, "k": r.k, "batch": r.batch,
            "blas_m": r.blas_m, "blas_n": r.blas_n, "blas_k": r.blas_k,
            "blas_trans_a": r.blas_trans_a, "blas_trans_b": r.blas_trans_b,
            "kernel": main, "kernels": kernels, "n_kernels": len(kernels),
            **decoded_columns(kn),
            "log_function": rec.function if rec else None,
            "algo_id": rec.algo_id if rec else None, "algo_tile": rec.tile if rec else None,
            "algo_stages": rec.algo_stages if rec else None, "algo_cluster": rec.cluster if rec else None,
            "algo_split_k": rec.num_splits_k if rec else None,
            "algo_reduction_scheme": rec.reduction_scheme if rec else None,
            "algo_custom_option": rec.custom_option if rec else None,
            "algo_cta_swizzling": _int_or_none(rec.cta_swizzling) if rec else None,
            "workspace_bytes": rec.workspace_bytes if rec else None,
            "epilogue": rec.epilogue if rec else None,
            "time_us": t, "time_us_min": r.time_us_min, "time_reps": r.time_us_reps,
            "time_gap_us": r.time_gap_us,
            "time_behind": (r.timing or {}).get("behind"),
            "time_us_first": r.time_us_first,
            "time_calls_per_rep": r.time_calls_per_rep,
            "kernel_time_us": sum(r.kernel_us) or None,
            "tflops": flops / t / 1e6 if t else None,
            "heuristic_miss_us": r.heuristic_miss_us, "heuristic_hit_us": r.heuristic_hit_us,
            "heuristic_shared": r.heuristic_shared,
            "lt_algo_tile": cfg.get("tile"), "lt_waves": r.lt_waves,
            "error": r.error,
            "consistent": consistency(kn, rec) if (kn and not r.error) else None,
            "log_matches_case": log_matches_case(
                {"backend": r.backend, "op": r.op, "dtype": r.dtype, "n": r.n, "k": r.k}, rec)
            if not r.error else None,
            "known_issue": _known_issue(rec, main, row.get("cublaslt_version"), r.env.get("cc") or env.get("cc")),
        })
        if r.candidates:
            from cublaslt_probe.analysis import candidates as cm
            reg = cm.regret(r.candidates, r.dtype)
            row.update({"n_candidates": reg["n_candidates"], "regret_pct": reg["regret_pct"],
                        "best_rank": reg["best_rank"], "best_kernel": reg["best_kernel"],
                        "noise_pct": reg["noise_pct"], "candidates": cm.to_json(r.candidates)})
        yield row


def _known_issue(rec, kernel: str | None, cublas, cc) -> str | None:
    """The `known_issue` column of a row: `logs.issues.record_label` of its logged config and main kernel."""
    from cublaslt_probe.logs.issues import record_label
    return record_label(rec, kernel=kernel, cublas=cublas, cc=cc)


def known_issue_column(df: pd.DataFrame, cc: str | None) -> pd.Series:
    """`known_issue` of every row from the dataset's own columns (algo_id, algo_split_k, algo_stages, blas_k,
    kernel, cublaslt_version) and the compute capability `cc`: what `build_rows` computes from the log line,
    for a dataset written before the column existed. One label per distinct config."""
    from cublaslt_probe import known_issues
    cols = ["algo_id", "algo_split_k", "algo_stages", "blas_k", "kernel", "cublaslt_version"]
    have = [c for c in cols if c in df.columns]
    memo: dict = {}
    out = []
    for vals in df[have].astype(object).itertuples(index=False, name=None):
        v = {c: (None if pd.isna(x) else x) for c, x in zip(have, vals)}
        if v.get("algo_id") is None:
            out.append(None)
            continue
        key = tuple(v.values())
        if key not in memo:
            cfg = {"algo_id": int(v["algo_id"]), "split_k": int(v.get("algo_split_k") or 1),
                   "stages": v.get("algo_stages"), "k": None if v.get("blas_k") is None else int(v["blas_k"]),
                   "grouped": False, "kernel": v.get("kernel")}
            memo[key] = known_issues.label(cfg, cublas=v.get("cublaslt_version"), cc=cc)
        out.append(memo[key])
    return pd.Series(out, index=df.index, dtype="string")


def decoded_columns(kn) -> dict:
    """The `vocab.DECODED_COLUMNS` of a decoded kernel name (all None without one)."""
    if kn is None:
        return dict.fromkeys(DECODED_COLUMNS)
    return {c: kn.short if c == "kernel_short" else getattr(kn, c) for c in DECODED_COLUMNS}


def _int_or_none(v):
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def build(records: Iterable[dict], env: dict | None = None) -> pd.DataFrame:
    """Raw probe records (+ env) -> the tidy DataFrame, typed by SCHEMA."""
    rows = list(build_rows(records, env))
    df = pd.DataFrame(rows, columns=COLUMNS)
    return coerce(df)


def coerce(df: pd.DataFrame) -> pd.DataFrame:
    for col, (dt, _) in SCHEMA.items():
        if col not in df:
            continue
        if dt == "object":
            continue
        if dt == "category":
            df[col] = df[col].astype("string").astype("category")
        else:
            df[col] = df[col].astype(dt)
    return df


def validate(df: pd.DataFrame) -> pd.DataFrame:
    """Check that `df` has every schema column with a compatible type; raises SchemaError naming them."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise SchemaError(f"dataset lacks columns {missing}; it has {list(df.columns)}. Rebuild it with "
                          "`cublaslt-probe dataset RAW.jsonl -o OUT.parquet`")
    bad = []
    for col, (dt, _) in SCHEMA.items():
        s = df[col]
        ok = {"Int64": pd.api.types.is_integer_dtype, "float64": pd.api.types.is_float_dtype,
              "boolean": lambda x: pd.api.types.is_bool_dtype(x) or x.isna().all(),
              }.get(dt, lambda x: True)(s)
        if not ok:
            bad.append(f"{col} ({s.dtype}, expected {dt})")
    if bad:
        raise SchemaError(f"dataset columns of the wrong type: {', '.join(bad)}")
    if df["key"].duplicated().any():
        dup = df.loc[df["key"].duplicated(), "key"].iloc[0]
        raise SchemaError(f"dataset has duplicate rows for key {dup!r}: merge with `cublaslt-probe merge`")
    return df


def with_env(schema, env: dict | None):
    """An Arrow schema carrying the environment and the schema version as file metadata (they travel with
    the file; `read_parquet` reads them back)."""
    meta = dict(schema.metadata or {})
    meta[b"cublaslt_probe.env"] = json.dumps(env or {}, default=str).encode()
    meta[b"cublaslt_probe.schema"] = b"1"
    return schema.with_metadata(meta)


@functools.cache
def _arrow_schema():
    import pyarrow as pa
    base = pa.Schema.from_pandas(coerce(pd.DataFrame(columns=COLUMNS)), preserve_index=False)
    fields = []
    for f in base:
        t = f.type
        if pa.types.is_dictionary(t):
            t = pa.dictionary(pa.int32(), pa.string())
        elif pa.types.is_null(t):   # the object columns: lists of strings
            t = pa.list_(pa.string())
        fields.append(pa.field(f.name, t))
    return pa.schema(fields, metadata=base.metadata)


def arrow_schema(env: dict | None = None):
    """The dataset schema as Arrow types that every batch of a streamed dataset is cast to (categories as
    dictionaries of 32-bit codes, the kernel list as a list of strings); with `env`, carrying it (`with_env`)."""
    return _arrow_schema() if env is None else with_env(_arrow_schema(), env)


def arrow_batch(records: list[dict], env: dict | None, schema):
    """Raw records as one Arrow table of the dataset `schema`, and the validated frame it came from."""
    import pyarrow as pa
    df = validate(build(records, env))
    return pa.Table.from_pandas(df, schema=schema, preserve_index=False), df


def write_parquet(df: pd.DataFrame, path: str | os.PathLike, env: dict | None = None) -> None:
    """Parquet with the environment also stored as file metadata (it travels with the file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    validate(df)
    table = pa.Table.from_pandas(df, preserve_index=False)
    pq.write_table(table.replace_schema_metadata(with_env(table.schema, env).metadata), path)


def read_parquet(path: str | os.PathLike) -> pd.DataFrame:
    """Read a dataset; the env sidecar is in `df.attrs['env']`."""
    import pyarrow.parquet as pq
    if not os.path.exists(path):
        raise SchemaError(f"no dataset at {path}: build one with `cublaslt-probe sweep` or use the shipped "
                          "data/h200_grid.parquet (or h200_llm, h200_square, h200_regret)")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several kinds
        raise SchemaError(f"{path} is not a readable Parquet dataset: {e}") from e
    df = table.to_pandas()
    meta = table.schema.metadata or {}
    df.attrs["env"] = json.loads(meta.get(b"cublaslt_probe.env", b"{}"))
    if "known_issue" not in df.columns and "algo_id" in df.columns:   # written before the column: derived
        df["known_issue"] = known_issue_column(df, df.attrs["env"].get("cc"))
    return df


def schema_markdown() -> str:
    lines = ["| column | type | meaning |", "|---|---|---|"]
    for col, (dt, meaning) in SCHEMA.items():
        lines.append(f"| `{col}` | {dt} | {meaning} |")
    return "\n".join(lines)
