"""Raw records -> Parquet: a slice's raw file read (gzip or not, a cut-off last line tolerated), its records
kept by key, and the dataset rows built, in this process or by processes started fresh for a large file."""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cublaslt_probe.errors import ProbeError
from cublaslt_probe.streams import complete_lines, cut_note, open_text
from cublaslt_probe.sweep.slices import WHOLE, Slice, _first_count, parse_shard

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("cublaslt_probe.sweep")


# --- datasets from raw files, and merging the parts of a sweep ----------------------------------------------
# Both stream: the records of a part are read twice (its keys, then its rows, a batch at a time), so memory
# stays flat in the number of rows; what grows with the plan is about 40 bytes a GEMM (the plan's columns,
# the key index, the part that holds each GEMM).
_GEMM_PREFIX = '{"type": "gemm", "key": "'
BATCH_ROWS = 8192
PART_PATTERNS = ("*.part-*-of-*.raw.jsonl", "*.part-*-of-*.raw.jsonl.gz", "*.part-*-of-*.parquet")


def _raw_lines(path: str, cuts: list | None = None):
    """(line, fast_key) for each record line of a raw file: every non-empty line but the env line. fast_key is
    the key of a line `run` wrote (its key comes first; read without parsing the JSON), else None. A gzip
    file that is cut off or damaged gives its lines before the damage, and its note (`streams.cut_note`)
    goes into `cuts`."""
    n = len(_GEMM_PREFIX)
    with open_text(path) as f:
        for line in complete_lines(f):
            if line.startswith(_GEMM_PREFIX) and line.endswith("\n"):
                end = line.find('"', n)
                if end > n and "\\" not in line[n:end]:
                    yield line, line[n:end]
                    continue
            if line.strip() and not line.startswith('{"type": "env"'):
                yield line, None
        note = cut_note(f)
        if note and cuts is not None:
            cuts.append((path, note))


def raw_keys(path: str, cuts: list | None = None):
    """The key of each record of a raw file, in order; None for a line that cannot be read (a record cut off
    mid-write) or holds no key. A cut or damaged gzip file's note goes into `cuts` (`_raw_lines`)."""
    for line, key in _raw_lines(path, cuts):
        if key is None:
            try:
                obj = json.loads(line)
            except ValueError:
                log.warning("%s: unreadable record skipped (a sweep cut off mid-write?)", path)
                obj = {}
            key = obj.get("key") if isinstance(obj, dict) and isinstance(obj.get("key"), str) else None
        yield key


def raw_env(path: str) -> dict:
    """The environment line of a raw file ({} without one)."""
    with open_text(path) as f:
        first = f.readline()
    try:
        obj = json.loads(first)
    except ValueError:
        return {}
    if not (isinstance(obj, dict) and obj.get("type") == "env"):
        return {}
    return {k: v for k, v in obj.items() if k != "type"}


class KeyIndex:
    """Keys -> their position in a list, through the sorted hashes of the keys (12 bytes a key, no strings
    kept). A hash is seeded per process; two keys of one list sharing one is told, not guessed around."""

    def __init__(self, keys):
        """`keys`: the keys in order, or lists of them in order (`Cases.key_chunks`)."""
        import numpy as np
        h = np.fromiter((hash(k) for ks in _chunked(keys) for k in ks), dtype=np.int64)
        order = np.argsort(h, kind="stable")
        self.sorted = h[order]
        self.order = order.astype(np.int32)
        if len(h) > 1 and (self.sorted[1:] == self.sorted[:-1]).any():
            raise ProbeError("two keys of the plan share a hash in this process: run the command again")

    def __len__(self) -> int:
        return len(self.sorted)

    def positions(self, keys: list) -> np.ndarray:
        """Position of each key; -1 for None, -2 for a key not in the list."""
        import numpy as np
        h = np.fromiter((0 if k is None else hash(k) for k in keys), dtype=np.int64, count=len(keys))
        if not len(self.sorted):
            pos = np.full(len(keys), -2, dtype=np.int32)
        else:
            i = np.minimum(np.searchsorted(self.sorted, h), len(self.sorted) - 1)
            pos = np.where(self.sorted[i] == h, self.order[i], -2)
        pos[np.fromiter((k is None for k in keys), dtype=bool, count=len(keys))] = -1
        return pos


def _chunked(keys):
    """A list of keys as one chunk; an iterator of lists as it is."""
    return [keys] if isinstance(keys, list) else keys


@dataclass
class Part:
    """One input of `merge` (or the raw file of `run`): a raw JSONL file or a Parquet dataset, the
    environment and slice it records, and after `scan` the plan position of each of its records."""

    path: str
    raw: bool
    env: dict
    slice: Slice = WHOLE
    positions: object = None     # numpy int32: plan position of each record (-1 unreadable, -2 not in the plan)
    keep: object = None          # numpy bool: the record that stands for its GEMM (a raw file's last one)
    strangers: list = field(default_factory=list)   # a few keys not in the plan
    cuts: list = field(default_factory=list)        # (path, why) when its gzip stream is cut off or damaged

    @classmethod
    def open(cls, path: str) -> "Part":
        if not os.path.exists(path):
            raise ProbeError(f"no part at {path}: name raw files (.raw.jsonl), datasets (.parquet), a folder "
                             "of parts or a glob")
        raw = path.endswith((".jsonl", ".jsonl.gz"))
        if raw:
            env = raw_env(path)
        else:
            import pyarrow.parquet as pq
            try:
                schema = pq.read_schema(path)
            except Exception as e:  # pyarrow raises several kinds
                raise ProbeError(f"{path} is not a raw file (.raw.jsonl) or a readable Parquet dataset: {e}") from e
            if "key" not in schema.names:
                raise ProbeError(f"{path} is a Parquet file but not a sweep's dataset (no `key` column)")
            meta = schema.metadata or {}
            env = json.loads(meta.get(b"cublaslt_probe.env", b"{}"))
        shard = env.get("shard")
        return cls(path, raw, env, parse_shard(shard, f"{path}: shard", blocks=True) if shard else WHOLE)

    def keys(self):
        """Each record's key, in order, a batch at a time."""
        if self.raw:
            batch = []
            del self.cuts[:]
            for k in raw_keys(self.path, self.cuts):
                batch.append(k)
                if len(batch) == 1 << 16:
                    yield batch
                    batch = []
            if batch:
                yield batch
        else:
            import pyarrow.parquet as pq
            for b in pq.ParquetFile(self.path).iter_batches(batch_size=1 << 16, columns=["key"]):
                yield b.column(0).to_pylist()

    def scan(self, index: KeyIndex) -> None:
        """Plan position of every record; `keep` marks the last record of each GEMM (a resumed raw file may
        hold a GEMM twice: the later record replaced the earlier)."""
        import numpy as np
        chunks = []
        for keys in self.keys():
            pos = index.positions(keys)
            if len(self.strangers) < 3 and (pos == -2).any():
                self.strangers += [keys[i] for i in np.nonzero(pos == -2)[0][:3 - len(self.strangers)]]
            chunks.append(pos)
        self.positions = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
        self.keep = np.zeros(len(self.positions), dtype=bool)
        rows = np.nonzero(self.positions >= 0)[0]
        _, last = np.unique(self.positions[rows][::-1], return_index=True)
        self.keep[rows[len(rows) - 1 - last]] = True

    def gemms(self) -> np.ndarray:
        """Plan positions of the GEMMs this part holds (each once)."""
        return self.positions[self.keep]


def find_parts(inputs: list[str]) -> list[str]:
    """Files, folders (their NAME.part-IIII-of-NNNN files) and globs -> part files, each once. Where a part has
    both its raw file and its dataset, the dataset is read if it is not older than the raw file (`run` writes it
    last, from the whole raw file), else the raw file."""
    import glob
    found = []
    for p in inputs:
        if os.path.isdir(p):
            hits = sorted(h for pat in PART_PATTERNS for h in glob.glob(os.path.join(glob.escape(p), pat)))
            if not hits:
                raise ProbeError(f"no part files in folder {p} (NAME.part-IIII-of-NNNN.raw.jsonl or .parquet, "
                                 "as `sweep --shard` writes them)")
            found += hits
        elif not os.path.exists(p) and glob.has_magic(p):
            hits = sorted(glob.glob(p))
            if not hits:
                raise ProbeError(f"no file matches {p}")
            found += hits
        else:
            found.append(p)
    by_base: dict[str, list[str]] = {}
    for p in dict.fromkeys(found):
        base = p
        for suffix in (".raw.jsonl.gz", ".raw.jsonl", ".parquet"):
            if p.endswith(suffix):
                base = p[:-len(suffix)]
                break
        by_base.setdefault(base, []).append(p)
    out = []
    for ps in by_base.values():
        pq_, raws = [p for p in ps if p.endswith(".parquet")], [p for p in ps if not p.endswith(".parquet")]
        if pq_ and raws:
            fresh = os.path.getmtime(pq_[0]) >= max(os.path.getmtime(r) for r in raws)
            ps = pq_ if fresh else raws
        out += ps
    return out


def _kept_records(path: str, keep, start: int = 0, stop: int | None = None):
    """The kept records of a raw file (those from record `start` to `stop` when given), parsed."""
    for i, (line, _) in enumerate(_raw_lines(path)):
        if i < start:
            continue
        if stop is not None and i >= stop:
            break
        if keep[i]:
            try:
                yield json.loads(line)
            except ValueError as e:
                raise ProbeError(f"{path}: record {i + 1} became unreadable while merging: {e}") from e


def _raw_tables(path: str, keep, env: dict, schema, start: int = 0, stop: int | None = None):
    """The kept records of a raw file (those from record `start` to `stop` when given) as Arrow tables of the
    dataset, BATCH_ROWS rows at a time."""
    from cublaslt_probe.analysis import dataset
    for table, _ in dataset.record_tables(_kept_records(path, keep, start, stop), env, schema, BATCH_ROWS):
        yield table


def _parquet_tables(path: str, keep, schema):
    import pyarrow as pa
    import pyarrow.parquet as pq
    start = 0
    for b in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
        t = pa.Table.from_batches([b])
        k = keep[start:start + len(t)]
        start += len(t)
        if not k.all():
            t = t.filter(pa.array(k))
        have = set(t.column_names)   # (a new list at each read of the property)
        for f in schema:   # a column the dataset's version did not have yet: null
            if f.name not in have:
                t = t.append_column(f.name, pa.nulls(len(t), f.type))
        yield t.select(schema.names).cast(schema)


def _raw_to_parquet(items, dest: str) -> int:
    """Raw parts (`items`: (path, keep, env, start, stop) each; records `start` to `stop` of each) as one Parquet
    file of the dataset schema, in row groups of BATCH_ROWS (run in a worker process by `write_dataset`).
    Consecutive parts whose environments agree on every column a row takes from one (`dataset.ENV_COLUMNS`)
    are built as one run of records: a batch's rows cost about 20 ms however few they are."""
    from itertools import groupby

    from cublaslt_probe.analysis.dataset import ENV_COLUMNS, arrow_schema, rebatch, record_tables, write_tables
    schema = arrow_schema()

    def tables():
        for _, same in groupby(items, key=lambda it: json.dumps([it[2].get(c) for c in ENV_COLUMNS], default=str)):
            same = list(same)
            records = (r for path, keep, _, a, b in same for r in _kept_records(path, keep, a, b))
            for t, _ in record_tables(records, same[0][2], schema, BATCH_ROWS):
                yield t
    return write_tables(rebatch(tables(), BATCH_ROWS), dest, schema)


CHUNK_ROWS = 32768   # a raw part of at least twice this many records is turned into rows by several processes


def _chunks(n: int, jobs: int, least: int = CHUNK_ROWS) -> list[tuple[int, int | None]]:
    """Record ranges [start, stop) of a raw part of `n` records for up to `jobs` processes, each of `least`
    records at least: the whole part as one range when it is smaller than two."""
    pieces = max(1, min(jobs, n // max(1, least)))
    if pieces == 1:
        return [(0, None)]
    step = -(-n // pieces)
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def _tasks(ranges: list[tuple[int, int, int | None]], sizes: list[int], least: int) -> list[list[tuple]]:
    """Consecutive record ranges ((part, start, stop), `sizes[i]` records in range i) of neighbouring parts
    packed into tasks of `least` records at least (the last, or one before a part not in the list, may hold
    fewer): the many small parts of a `--devices` sweep become a few tasks for the row-building processes,
    not one each (a task costs its process and the merging process about 10-20 ms whatever it holds).
    `write_dataset` asks for four tasks per process at least, so that the merging process writes the first
    tasks' rows while the processes build the later ones."""
    tasks, cur, held = [], [], 0
    for r, n in zip(ranges, sizes):
        if cur and r[0] > cur[-1][0] + 1:   # a part between them is not in the list (a dataset): keep the order
            tasks.append(cur)
            cur, held = [], 0
        cur.append(r)
        held += n
        if held >= least:
            tasks.append(cur)
            cur, held = [], 0
    if cur:
        tasks.append(cur)
    return tasks


def _use_cpus(cpus) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


BUILDER_ROWS = 512   # with `RowBuilders` started ahead, a raw part is cut into ranges of this many records at least
BUILDERS_MAX = 16    # `RowBuilders` one sweep process starts at most (each holds pandas and pyarrow: 100-200 MB)
HOST_PROCS_VARS = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")   # sweep processes a launcher starts per host


def builder_jobs(cpus: int | None = None, environ=None) -> int:
    """How many `RowBuilders` this sweep process starts: the CPUs it may use (`cpus`, else its affinity)
    shared with the other sweep processes a launcher started on this host (torchrun's LOCAL_WORLD_SIZE,
    Slurm's SLURM_NTASKS_PER_NODE), BUILDERS_MAX at most, one at least."""
    cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
    procs = _first_count(HOST_PROCS_VARS, environ, least=1) or 1
    return max(1, min(BUILDERS_MAX, cpus // procs))


def _pool_init(cpus, parent: int) -> None:
    """A worker of the pools that turn raw records into rows, as it starts: on its CPUs, and ended when
    the process that started it is gone. A pool's idle worker waits on a queue whose writing end it holds
    itself, so a sweep or merge killed outright (SIGKILL, the out-of-memory killer, a scheduler's preemption)
    would leave it waiting for ever; a thread looks for the parent every second instead."""
    import threading
    _use_cpus(cpus)

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)
    threading.Thread(target=watch, name="cublaslt-probe-parent-watch", daemon=True).start()


def _builder_init(cpus, parent: int) -> None:
    """A `RowBuilders` process as it starts (`_pool_init`), with what turns records into rows imported."""
    _pool_init(cpus, parent)
    _builder_imports()


def _builder_imports() -> None:
    """Import what turns records into rows and writes them (pandas, pyarrow) and build the dataset schema once."""
    import pyarrow.parquet  # noqa: F401  (imported while the builder waits idle)

    from cublaslt_probe.analysis import dataset
    dataset.arrow_schema()


def _builder_pid() -> int:
    return os.getpid()


class RowBuilders:
    """Processes that turn a sweep's raw records into dataset rows at its end, started before the probe.

    A row costs a fraction of a millisecond of host time (its log line parsed, its kernels decoded): seconds at
    the end of a large sweep, in the sweep's one process (docs/sweep.md gives the figures). Processes started
    fresh at the end would spend longer importing pandas and pyarrow than they save; started before the probe (while it
    loads torch
    and cuBLASLt, and on every CPU, before it pins its thread) they wait, idle, for the sweep's end and then
    each take a range of `BUILDER_ROWS` records or more; `builder_jobs` says how many. Fresh processes
    (spawn): the sweep's process will hold a CUDA context, which must not be forked."""

    def __init__(self, jobs: int | None = None):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        self.jobs = max(1, jobs or builder_jobs())
        self.pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_builder_init, initargs=(os.sched_getaffinity(0), os.getpid()))
        self._ready = [self.pool.submit(_builder_pid) for _ in range(self.jobs)]   # every process started now
        _builder_imports()   # and this process ready to write their rows, before the probe starts, not after the sweep

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_dataset(parts: list[Part], out: str, env: dict, jobs: int = 1, spawn: bool = False,
                  cpus: set[int] | None = None, chunk_rows: int | None = None,
                  builders: RowBuilders | None = None) -> int:
    """Stream the kept records of scanned `parts` into the Parquet dataset `out` (written whole or not at
    all, `dataset.write_tables`). Raw parts are turned into rows by up to `jobs` processes: one per part, and
    a part of many records (`_chunks`) by several. `spawn` starts them fresh (from a process holding a CUDA
    context, which must not be forked); `cpus`: the CPUs they run on (a process started by a pinned thread
    inherits its one core). With `builders` (started ahead), its processes do that work instead, in ranges
    of `BUILDER_ROWS` records at least. Returns the rows written."""
    import multiprocessing
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    import pyarrow.parquet as pq

    from cublaslt_probe.analysis.dataset import arrow_schema, rebatch, write_tables
    schema = arrow_schema(env)
    tmp_dir = tempfile.mkdtemp(prefix=".merge-", dir=os.path.dirname(os.path.abspath(out)))
    if builders is not None:
        jobs, chunk_rows = builders.jobs, chunk_rows or BUILDER_ROWS
    ranges = [(pi, a, b) for pi, p in enumerate(parts) if p.raw
              for a, b in (_chunks(len(p.positions), jobs, chunk_rows or CHUNK_ROWS) if jobs > 1 else [(0, None)])]
    sizes = [(len(parts[pi].positions) if b is None else b) - a for pi, a, b in ranges]
    tasks = _tasks(ranges, sizes, min(chunk_rows or CHUNK_ROWS, -(-sum(sizes) // (4 * max(1, jobs)))))
    pool = None
    if builders is not None:
        pool = builders.pool
    elif jobs > 1 and len(tasks) > 1:
        ctx = multiprocessing.get_context("spawn") if spawn else None
        pool = ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=ctx, initializer=_pool_init,
                                   initargs=(cpus, os.getpid()))
    try:
        futures: dict[int, list] = {}   # the first part of each task: (its future, its file)
        if pool:
            for ti, task in enumerate(tasks):
                dest = os.path.join(tmp_dir, f"{ti}.parquet")
                items = [(parts[pi].path, parts[pi].keep, parts[pi].env, a, b) for pi, a, b in task]
                futures.setdefault(task[0][0], []).append((pool.submit(_raw_to_parquet, items, dest), dest))
            in_task = {pi for task in tasks for pi, _, _ in task}

        def tables():
            for pi, p in enumerate(parts):
                if pi in futures:
                    for fut, dest in futures.pop(pi):
                        fut.result()
                        yield from _parquet_tables(dest, _all(pq.ParquetFile(dest).metadata.num_rows), schema)
                elif pool and pi in in_task:
                    continue   # in a task that began with an earlier part
                elif p.raw:
                    yield from _raw_tables(p.path, p.keep, p.env, schema)
                else:
                    yield from _parquet_tables(p.path, p.keep, schema)
        return write_tables(rebatch(tables(), BATCH_ROWS), out, schema)
    finally:
        if pool and builders is None:
            pool.shutdown(cancel_futures=True)
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _all(n: int):
    import numpy as np
    return np.ones(n, dtype=bool)
