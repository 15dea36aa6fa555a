"""Real profiler captures changed the ways real files differ, and what a correct reader must find in them.

Used by tests/test_fuzz_traces.py and benchmarks/bench_trace_hostbound.py. Every input starts from a committed
capture (tests/fixtures/programs/*/trace.json.gz, tests/fixtures/traces/*.json.gz, tests/fixtures/coldstart/,
PROVENANCE.md in each folder) and is changed the way files from other profiler settings, merged ranks, other
tools' exports or damaged disks differ (issue 36): whole event categories or id fields left out or written as
another type, two processes in one file, step ranges repeated, nested, overlapping or written as B/E pairs,
durations that are not durations, odd ``deviceProperties`` and ``env.json``, gzip damage, a bare event array,
a byte-order mark, deep nesting, ``args`` that is not an object, ``name`` that is not a string.

A mutation returns the bytes of the file and the events a correct reader has to work from (`Built.events`):
the mutated document's events, or for a damaged file the complete events before the damage, found here by
the standard library's decoders, apart from the package's reader. `gemm_truth` sums the GEMM-kind kernels of
those events with the package's kernel-name decoder (the one rule of what a GEMM is) and nothing else of it.
"""
from __future__ import annotations

import copy
import gzip
import json
import math
import shutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PROGRAMS = FIXTURES / "programs"
STEP_PREFIX = "cublaslt_probe.step:"      # the capture's step ranges (runfiles.STEP_PREFIX; kept apart on purpose)
KERNEL_CATS = ("kernel", "Kernel")
ID_KEYS = ("External id", "correlation")
DEEP = 100_000                             # nesting depth of the deep-nesting mutation


# ------------------------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    """A committed capture: a run folder (trace.json.gz, env.json, cublaslt.log) or a bare trace file."""
    name: str
    trace: Path
    folder: Path | None = None

    @property
    def target(self) -> Path:
        return self.folder if self.folder is not None else self.trace


def sources() -> dict[str, Source]:
    out = {}
    for t in sorted(PROGRAMS.glob("*/trace.json.gz")):
        out[t.parent.name] = Source(t.parent.name, t, t.parent)
    for t in sorted((FIXTURES / "traces").glob("*.json.gz")):
        out["traces/" + t.name.split(".")[0]] = Source("traces/" + t.name.split(".")[0], t)
    return out


_RAW: dict[Path, bytes] = {}


def raw_json(path: Path) -> bytes:
    """The decompressed bytes of a committed capture (cached: the fixtures do not change during a run)."""
    if path not in _RAW:
        data = path.read_bytes()
        _RAW[path] = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    return _RAW[path]


def load(path: Path) -> dict:
    return json.loads(raw_json(path))


# ------------------------------------------------------------------------------------------- truth
def valid_dur(v) -> float | None:
    """A duration a reader can trust: a finite number >= 0 (a number written as a string counts)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f >= 0 else None


_KIND: dict[str, bool] = {}


def is_gemm(name) -> bool:
    if not isinstance(name, str):
        return False
    k = _KIND.get(name)
    if k is None:
        from cublaslt_probe.names import decode
        k = _KIND[name] = decode(name).kind == "gemm"
    return k


def gemm_truth(events: list) -> tuple[float, int, int]:
    """(µs, launches, launches with an invalid duration) of the GEMM-kind kernel events."""
    total, n, bad = 0.0, 0, 0
    for e in events:
        if isinstance(e, dict) and e.get("cat") in KERNEL_CATS and is_gemm(e.get("name")):
            d = valid_dur(e.get("dur"))
            n += 1
            if d is None:
                bad += 1
            else:
                total += d
    return total, n, bad


def gpu_events(events: list) -> int:
    """Kernels, copies and fills: anything `trace` can report on."""
    return sum(1 for e in events if isinstance(e, dict)
               and e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset"))


def recoverable_events(data: bytes) -> list:
    """The complete events of a possibly damaged trace file: gunzip what zlib can, then decode one event
    after the other from the start of the event array until the first that does not decode."""
    if data[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = bytearray()
        for i in range(0, len(data), 1 << 12):
            try:
                out += d.decompress(data[i:i + (1 << 12)])
            except zlib.error:      # that block again a byte at a time: all zlib gives before the damage
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                out = bytearray(d.decompress(data[:i]))
                for j in range(i, min(i + (1 << 12), len(data))):
                    try:
                        out += d.decompress(data[j:j + 1])
                    except zlib.error:
                        break
                break
        data = bytes(out)
    text = data.decode("utf-8", "replace").lstrip("\ufeff")
    start = text.find('"traceEvents"')
    if start >= 0:
        start = text.find("[", start)
    elif text.lstrip().startswith("["):
        start = text.find("[")
    if start < 0:
        return []
    dec, pos, evs = json.JSONDecoder(), start + 1, []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return evs
        try:
            ev, pos = dec.raw_decode(text, pos)
        except ValueError:
            return evs
        evs.append(ev)


# ------------------------------------------------------------------------------------------- building
@dataclass
class Built:
    """One mutated input: the path to give the CLI, the events a correct reader works from, and facts."""
    target: Path
    trace: Path
    events: list
    size_ratio: float = 1.0          # events of the mutated input / events of the source
    coldstart: Path | None = None    # for coldstart mutations: the mutated cold-start file
    notes: list = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return gpu_events(self.events) > 0


@dataclass(frozen=True)
class Mutation:
    """``doc``: fn(doc, src) changes the parsed document in place (or returns another one); ``bytes``:
    fn(json_bytes) -> file bytes (or (bytes, events)); ``env``: fn(env) -> the env.json value; ``pair``:
    fn(doc, other_doc)."""
    name: str
    how: str
    fn: Callable
    needs: str = ""                  # "steps", "env", "gemm", "log": which sources it applies to
    invariant: bool = False          # audit's figures must equal the unmutated input's
    gz: bool = False                 # write the trace gzipped whatever the source


def _events(doc) -> list:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _drop_cats(*cats):
    def fn(doc, src):
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in cats]
    return fn


def _drop_arg(*keys, cats=None):
    def fn(doc, src):
        for e in doc["traceEvents"]:
            a = e.get("args")
            if isinstance(a, dict) and (cats is None or e.get("cat") in cats):
                for k in keys:
                    a.pop(k, None)
    return fn


def _map_ids(f):
    def fn(doc, src):
        for e in doc["traceEvents"]:
            a = e.get("args")
            if isinstance(a, dict):
                for k in ID_KEYS:
                    if type(a.get(k)) is int:
                        a[k] = f(a[k])
            if e.get("cat") == "ac2g" and type(e.get("id")) is int:
                e["id"] = f(e["id"])
    return fn


def _steps(doc) -> list:
    return [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"
            and str(e.get("name", "")).startswith((STEP_PREFIX, "ProfilerStep#"))]


def _dup_steps(doc, src):
    doc["traceEvents"] += [copy.deepcopy(e) for e in _steps(doc)]


def _nest_steps(doc, src):
    st = _steps(doc)
    t0, t1 = min(e["ts"] for e in st), max(e["ts"] + e["dur"] for e in st)
    outer = dict(copy.deepcopy(st[0]), name=STEP_PREFIX + str(len(st)), ts=t0 - 1.0, dur=t1 - t0 + 2.0)
    doc["traceEvents"].append(outer)


def _overlap_steps(doc, src):
    st = sorted(_steps(doc), key=lambda e: e["ts"])
    for a, b in zip(st, st[1:]):
        a["dur"] = (b["ts"] + b["dur"] / 2) - a["ts"]     # runs into the middle of the next step


def _be_steps(doc, src):
    """Each step range as a B/E pair (valid Chrome trace format, as other exporters write ranges)."""
    steps = {id(e) for e in _steps(doc)}
    out = []
    for e in doc["traceEvents"]:
        if id(e) in steps:
            b = {k: v for k, v in e.items() if k != "dur"}
            out += [dict(b, ph="B"), {"ph": "E", "cat": e["cat"], "name": e["name"], "pid": e["pid"],
                                      "tid": e["tid"], "ts": e["ts"] + e["dur"]}]
        else:
            out.append(e)
    doc["traceEvents"] = out


def _first(doc, pred):
    for e in doc["traceEvents"]:
        if isinstance(e, dict) and pred(e):
            return e
    raise LookupError("no such event")


def _gemm_kernels(doc) -> list:
    return [e for e in doc["traceEvents"] if e.get("cat") in KERNEL_CATS and is_gemm(e.get("name"))]


def _bad_dur(value):
    def fn(doc, src):
        ks = _gemm_kernels(doc)
        for e in ks[:: max(1, len(ks) // 3)]:        # a few spread over the trace
            e["dur"] = value
    return fn


def _args_not_object(doc, src):
    _gemm_kernels(doc)[0]["args"] = ["device", 0]
    _first(doc, lambda e: e.get("cat") == "cpu_op")["args"] = "aten::mm"
    _first(doc, lambda e: e.get("cat") == "cuda_runtime")["args"] = 5


def _name_not_string(doc, src):
    _gemm_kernels(doc)[0]["name"] = 12345
    _first(doc, lambda e: e.get("cat") == "cpu_op")["name"] = ["aten::mm"]
    _first(doc, lambda e: e.get("cat") == "cuda_runtime")["name"] = None


def _devprops_object(doc, src):
    p = doc.get("deviceProperties")
    doc["deviceProperties"] = p[0] if isinstance(p, list) and p else {"name": "NVIDIA H200"}


def _devprops_missing(doc, src):
    doc.pop("deviceProperties", None)


def _devprops_two(doc, src):
    p = copy.deepcopy(doc.get("deviceProperties") or [])
    other = dict(p[0] if p else {}, id=len(p), name="NVIDIA A100-SXM4-80GB", numSms=108, computeMajor=8,
                 computeMinor=0, totalGlobalMem=85_899_345_920)
    doc["deviceProperties"] = p + [other]


def _shift_process(doc, pid_add: int, dev_add: int, t_add: float) -> list:
    """The events of `doc` as another process on another device (a second rank): CPU pids + pid_add, GPU
    pids and args.device + dev_add, times + t_add."""
    out = []
    for e in doc["traceEvents"]:
        e = copy.copy(e)
        if isinstance(e.get("args"), dict):
            e["args"] = dict(e["args"])
        if e.get("cat") in KERNEL_CATS + ("gpu_memcpy", "gpu_memset", "gpu_user_annotation"):
            if type(e.get("pid")) is int:
                e["pid"] += dev_add
            if type(e["args"].get("device")) is int:
                e["args"]["device"] += dev_add
        elif type(e.get("pid")) is int and e.get("pid", 0) > 64:
            e["pid"] += pid_add
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += t_add
        out.append(e)
    return out


def _merge(doc, other, t_add: float):
    n = len(doc.get("deviceProperties") or [])
    doc["traceEvents"] = doc["traceEvents"] + _shift_process(other, 1, max(n, 1), t_add)
    props = copy.deepcopy(other.get("deviceProperties") or [])
    for i, p in enumerate(props):
        p["id"] = n + i
    doc["deviceProperties"] = (doc.get("deviceProperties") or []) + props


def _merge_same(doc, src):
    """The same capture as a second rank, a quarter step later (ranks run at once: their steps overlap)."""
    st = _steps(doc)
    shift = st[0]["dur"] / 4 if st else 37.5
    _merge(doc, copy.deepcopy(doc), shift)


def _merge_other(doc, src):
    """Another program's capture as a second process, moved to start with this one."""
    partner = PARTNER.get(src.name, "llama_decode")
    other = load(sources()[partner].trace)
    t = lambda d: min(e["ts"] for e in d["traceEvents"] if isinstance(e.get("ts"), (int, float)))
    _merge(doc, other, t(doc) - t(other))


PARTNER = {"llama_decode": "mixtral_moe"}


def _bom(data: bytes) -> bytes:
    return b"\xef\xbb\xbf" + data


def _bare(data: bytes) -> bytes:
    return json.dumps(json.loads(data)["traceEvents"]).encode()


def _deep(data: bytes) -> bytes:
    doc = json.loads(data)
    e = _first(doc, lambda e: e.get("cat") == "cpu_op" and isinstance(e.get("args"), dict))
    e["args"]["deep"] = "@@DEEP@@"
    # the standard decoder cannot read it back either: the events to work from are given with the bytes
    return json.dumps(doc).encode().replace(b'"@@DEEP@@"', b"[" * DEEP + b"]" * DEEP), doc["traceEvents"]


def _gz_damage(where: str):
    def fn(data: bytes) -> bytes:
        gz = bytearray(gzip.compress(data, 6, mtime=0))
        at = {"head": 40, "early": min(3000, len(gz) // 4), "middle": len(gz) // 2, "trailer": len(gz) - 6}[where]
        for i in range(at, min(at + 16, len(gz))):
            gz[i] ^= 0x5A
        return bytes(gz)
    return fn


def _gz_cut(frac: float):
    def fn(data: bytes) -> bytes:
        gz = gzip.compress(data, 6, mtime=0)
        return gz[: int(len(gz) * frac)]
    return fn


def _env_not_object(env):
    return ["NVIDIA H200", 132]


def _env_wrong_types(env):
    return dict(env, cc=9.0, sm_count="132", gpu=5)


def _env_other_gpu(env):
    return dict(env, gpu="NVIDIA A100-SXM4-80GB", sm_count=108, cc="8.0")


MUTATIONS: dict[str, Mutation] = {m.name: m for m in [
    Mutation("unmutated", "doc", lambda doc, src: None, invariant=True),     # the control: the capture as is
    Mutation("drop_cuda_runtime", "doc", _drop_cats("cuda_runtime", "cuda_driver"), needs="gemm"),
    Mutation("drop_external_ids", "doc", _drop_arg("External id"), needs="gemm"),
    Mutation("drop_ac2g", "doc", _drop_cats("ac2g"), invariant=True),
    Mutation("drop_python_function", "doc", _drop_cats("python_function")),
    Mutation("drop_user_annotation", "doc", _drop_cats("user_annotation")),
    Mutation("drop_gpu_user_annotation", "doc", _drop_cats("gpu_user_annotation"), invariant=True),
    Mutation("drop_sequence_numbers", "doc", _drop_arg("Sequence number")),
    Mutation("drop_correlation", "doc", _drop_arg("correlation"), needs="gemm"),
    # kernels with no launch record at all (as graph replays and some exporters write them)
    Mutation("drop_kernel_links", "doc", _drop_arg("External id", "correlation", cats=KERNEL_CATS), needs="gemm"),
    Mutation("ids_strings", "doc", _map_ids(str), needs="gemm"),
    Mutation("ids_floats", "doc", _map_ids(float), needs="gemm"),
    Mutation("ids_huge", "doc", _map_ids(lambda v: v + (1 << 63)), needs="gemm", invariant=True),
    Mutation("ids_negative", "doc", _map_ids(lambda v: -v - 1), needs="gemm"),
    Mutation("merge_same_program", "doc", _merge_same, gz=True),
    Mutation("merge_two_programs", "doc", _merge_other, gz=True),
    Mutation("steps_duplicated", "doc", _dup_steps, needs="steps", invariant=True),
    Mutation("steps_nested", "doc", _nest_steps, needs="steps", invariant=True),
    Mutation("steps_overlap", "doc", _overlap_steps, needs="steps"),
    Mutation("steps_be_pairs", "doc", _be_steps, needs="steps", invariant=True),
    Mutation("dur_nan_string", "doc", _bad_dur("NaN"), needs="gemm"),
    Mutation("dur_negative", "doc", _bad_dur(-1234.5), needs="gemm"),
    Mutation("dur_zero", "doc", _bad_dur(0), needs="gemm"),
    Mutation("dur_inf", "doc", _bad_dur(float("inf")), needs="gemm"),
    Mutation("dur_string", "doc", _bad_dur("fast"), needs="gemm"),
    Mutation("devprops_object", "doc", _devprops_object),
    Mutation("devprops_missing", "doc", _devprops_missing),
    Mutation("devprops_two_kinds", "doc", _devprops_two, invariant=True),
    Mutation("env_not_object", "env", _env_not_object, needs="env"),
    Mutation("env_wrong_types", "env", _env_wrong_types, needs="env"),
    Mutation("env_other_gpu", "env", _env_other_gpu, needs="env"),
    Mutation("gzip_head", "bytes", _gz_damage("head"), gz=True),
    Mutation("gzip_early", "bytes", _gz_damage("early"), gz=True),
    Mutation("gzip_middle", "bytes", _gz_damage("middle"), gz=True),
    Mutation("gzip_trailer", "bytes", _gz_damage("trailer"), gz=True),
    Mutation("gzip_cut", "bytes", _gz_cut(0.6), gz=True),
    Mutation("bare_array", "bytes", _bare),
    Mutation("utf8_bom", "bytes", _bom, invariant=True),
    Mutation("deep_nesting", "bytes", _deep),
    Mutation("args_not_object", "doc", _args_not_object, needs="gemm"),
    Mutation("name_not_string", "doc", _name_not_string, needs="gemm"),
]}


_HOLDS: dict[Path, tuple[bool, bool]] = {}


def _holds(path: Path) -> tuple[bool, bool]:
    """Whether the committed capture holds step marks, and GEMM kernels (read once: `applies` asks per case)."""
    if path not in _HOLDS:
        doc = load(path)
        _HOLDS[path] = (bool(_steps(doc)), gemm_truth(doc["traceEvents"])[1] > 0)
    return _HOLDS[path]


def applies(m: Mutation, src: Source) -> bool:
    if m.needs == "env":
        return src.folder is not None and (src.folder / "env.json").exists()
    if m.needs == "steps":
        return _holds(src.trace)[0]
    if m.needs == "gemm":
        return _holds(src.trace)[1]
    return True


def build(m: Mutation, src: Source, where: Path) -> Built:
    """Write `src` changed by `m` under `where` (a run folder when `src` is one, else a file)."""
    where.mkdir(parents=True, exist_ok=True)
    data = raw_json(src.trace)
    n0 = len(load(src.trace)["traceEvents"])
    env_value = None
    if m.how == "doc":
        doc = json.loads(data)
        doc = m.fn(doc, src) or doc
        data = json.dumps(doc).encode()
        events = _events(doc)
    elif m.how == "bytes":
        data = m.fn(data)
        events = None
        if isinstance(data, tuple):
            data, events = data
    elif m.how == "env":
        env_value = m.fn(json.loads((src.folder / "env.json").read_text()))
        events = load(src.trace)["traceEvents"]
    else:
        raise ValueError(m.how)
    gz_out = m.gz or src.folder is not None
    if gz_out and data[:2] != b"\x1f\x8b":
        data = gzip.compress(data, 1, mtime=0)
    if src.folder is not None:
        run = where / src.folder.name
        run.mkdir(exist_ok=True)
        for f in ("env.json", "cublaslt.log"):
            if (src.folder / f).exists():
                shutil.copyfile(src.folder / f, run / f)
        if env_value is not None:
            (run / "env.json").write_text(json.dumps(env_value))
        trace = run / "trace.json.gz"
        target = run
    else:
        trace = where / (src.trace.name.split(".")[0] + (".json.gz" if gz_out else ".json"))
        target = trace
    trace.write_bytes(data)
    if events is None:
        events = recoverable_events(data)
    return Built(target, trace, events, size_ratio=max(1.0, len(events) / max(n0, 1)))


# ------------------------------------------------------------------------------------------- cold-start files
def _cs_not_object(data: bytes) -> bytes:
    return json.dumps([json.loads(data)]).encode()


def _cs_runs_list(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["runs"] = list(doc.get("runs", {}).values())
    return json.dumps(doc).encode()


def _cs_wrong_type(data: bytes) -> bytes:
    """Every window's wall time a string, as an edited file might hold (valid JSON, a value of another type)."""
    doc = json.loads(data)
    for run in doc.get("runs", {}).values():
        for w in run.get("windows", []):
            w["wall_s"] = f"{w['wall_s']} s"
    return json.dumps(doc).encode()


COLDSTART_MUTATIONS: dict[str, Callable[[bytes], bytes]] = {
    "gzip_head": _gz_damage("head"), "gzip_middle": _gz_damage("middle"), "gzip_trailer": _gz_damage("trailer"),
    "gzip_cut": _gz_cut(0.5), "utf8_bom": lambda d: gzip.compress(_bom(d), 1, mtime=0),
    "not_an_object": lambda d: gzip.compress(_cs_not_object(d), 1, mtime=0),
    "runs_a_list": lambda d: gzip.compress(_cs_runs_list(d), 1, mtime=0),
    "a_value_of_another_type": lambda d: gzip.compress(_cs_wrong_type(d), 1, mtime=0),
    "deep_nesting": lambda d: gzip.compress(d.replace(b'"schema": 1', b'"schema": 1, "deep": '
                                                      + b"[" * DEEP + b"]" * DEEP, 1), 1, mtime=0),
}
