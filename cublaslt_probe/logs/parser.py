"""cuBLASLt log lines (``CUBLASLT_LOG_LEVEL`` / ``CUBLASLT_LOG_MASK`` output) → `LogRecord`.

Line grammar (docs/logs.md has the full description)::

    line    := "[" time "]" "[" library "]" "[" pid "]" "[" tag "]" "[" function "] " body
    body    := ( item ( " " item )* )?        -- for Info/Hints/Error lines also free text
    item    := key "=" ( value | "[" body "]" )
    key     := [A-Za-z0-9_]+
    value   := any characters except white space, "[" and "]"

Parsing is streaming and never raises on a bad line (it is counted in `ParseStats`). Real logs repeat the
same GEMMs over and over, so small per-file caches (bounded: memory stays flat) turn most lines into a
dictionary lookup: the whole line, the text after its timestamp, and that text with its pointer values
(``=0X7F...``) cut out each map to a record template (see `_iter_lines`). A line seen in no form is
matched by one compiled regex for the prefix and tokenized in one pass with string methods
(`_assign_fast`), with the strict scanner `scan` as the fallback that also words the errors.
"""
from __future__ import annotations

import logging
import re
from operator import attrgetter
from typing import Iterable, Iterator

from cublaslt_probe.logs._io import READ_ERRORS, LogReadError, Source, describe_read_error, open_lines, source_name
from cublaslt_probe.logs.record import FIELD_NAMES, LEVEL_TAGS, LEVELS, LogRecord, ParseStats, op_letter

log = logging.getLogger(__name__)

_PREFIX = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]\[(\w+)\]\[(\d+)\]\[(\w+)\]\[(\w+)\](?: |\Z)")
# One token of a body: "key=[", "key=value", "]", a bare value (inside "[...]" only) or the end.
# White space between items is any run of spaces, tabs or stray CRs.
_TOKEN = re.compile(r"\s*(?:(\w+)=(?:(\[)|([^\s\[\]]*))|(\])|([^\s\[\]]+)|\Z)")
_MATMUL_FN = re.compile(r"cublasLt[A-Z]*Matmul")
# A pointer value: cuBLASLt prints addresses as 0X7F0118000000 (and NULL pointers as 0X0).
_PTR_SPLIT = re.compile(r"=(0[Xx][0-9A-Fa-f]+)(?=[\s\]]|\Z)")
_PTR_VALUE = re.compile(r"0[Xx][0-9A-Fa-f]+")
_STAMP = re.compile(r"\A\[\d{4}-\d\d-\d\d [^]]*\]")   # a line's time stamp (`without_pointers`)

_CACHE_MAX = 4096
_HEAD = 21  # len("[2026-11-30 03:21:52]")
# The fields of a record template: everything between `time` and `extra` (`message` last).
_TEMPLATE_FIELDS = FIELD_NAMES[2:-1]
assert FIELD_NAMES[:2] == ("line", "time") and FIELD_NAMES[-2:] == ("message", "extra")


class DamagedLine(Exception):
    """Internal: a line is damaged; the message is the reason shown to the user."""


# --- the body tokenizer ---------------------------------------------------------------------------------

def scan(body: str, offset: int = 0) -> list[tuple[str, object]]:
    """``"a=1 d=[x=2 y=3] r=[66 12]"`` → ``[("a", "1"), ("d", [("x", "2"), ("y", "3")]), ("r", "66 12")]``.

    A ``[...]`` holding anything but ``key=value`` items (``heuristicResults=[66]``) is kept verbatim as
    one value. Raises `DamagedLine` on unbalanced brackets or free text outside brackets; the column it
    names is 1-based, counted from `offset` (the body's position in its line).
    """
    root: list = []
    stack: list = []  # open groups: (items, start of their text, holds bare values)
    cur = root
    raw = False
    start = 0
    pos = 0
    match = _TOKEN.match
    while True:
        mt = match(body, pos)
        if mt is None:
            raise DamagedLine(f"unexpected {body[pos:pos + 12]!r} at column {offset + pos + 1}")
        key, opening, value, closing, bare = mt.groups()
        end = mt.end()
        if key is not None:
            if opening:
                stack.append((cur, start, raw))
                new: list = []
                cur.append((key, new))
                cur, start, raw = new, end, False
            else:
                cur.append((key, value))
        elif closing:
            if not stack:
                raise DamagedLine(f"unbalanced ']' at column {offset + end}")
            text = body[start:end - 1]
            cur, start, was_raw = stack.pop()
            if raw:  # a list of plain values: keep the text inside the brackets
                cur[-1] = (cur[-1][0], text.strip())
            raw = was_raw
        elif bare is not None:
            if not stack:
                raise DamagedLine(f"text without key= at column {offset + pos + 1}: {bare[:20]!r}")
            raw = True
        else:  # end of text
            if stack:
                raise DamagedLine("line ends inside '[...]' (truncated?)")
            return root
        if end == pos:  # cannot happen with the grammar above; guards against a loop
            raise DamagedLine(f"unexpected {body[pos:pos + 12]!r} at column {offset + pos + 1}")
        pos = end


# --- from tokens to record fields -----------------------------------------------------------------------
# The body is flattened to (dotted key, value) pairs: "Adesc=[type=R_16BF rows=4096]" → ("Adesc.type",
# "R_16BF"), ("Adesc.rows", "4096"); tables keyed by the dotted key say which field each pair fills.

def _strip(prefix: str):
    n = len(prefix)
    return lambda v: v[n:] if v.startswith(prefix) else v


def _to_bool(v: str) -> bool:
    if v in ("0", "1"):
        return v == "1"
    raise ValueError(v)


# dotted key → (field, converter)
_FIELDS = {
    "computeDesc.computeType": ("compute_type", None),
    "computeDesc.scaleType": ("scale_type", None),
    "computeDesc.transa": ("op_a", op_letter),
    "computeDesc.transb": ("op_b", op_letter),
    "computeDesc.epilogue": ("epilogue", None),
    "algo.algoId": ("algo_id", int),
    "algo.tile": ("tile", _strip("MATMUL_TILE_")),
    "algo.stages": ("algo_stages", _strip("MATMUL_STAGES_")),
    "algo.clusterShape": ("cluster", _strip("CLUSTER_SHAPE_")),
    "algo.numSplitsK": ("num_splits_k", int),
    "algo.reductionScheme": ("reduction_scheme", _strip("REDUCTION_SCHEME_")),
    "algo.customOption": ("custom_option", int),
    "algo.ctaSwizzling": ("cta_swizzling", int),
    "algo.swizzling": ("cta_swizzling", int),
    "algo.swizzle": ("cta_swizzling", int),
    "workSpaceSizeInBytes": ("workspace_bytes", int),
    "workspaceSizeInBytes": ("workspace_bytes", int),
    "preference.maxWorkspaceSizeinBytes": ("workspace_bytes", int),
    "preference.maxWorkspaceSizeInBytes": ("workspace_bytes", int),
    "beta": ("beta_value", float),
    "outOfPlace": ("out_of_place", _to_bool),
    "smCountTarget": ("sm_count_target", int),
    "computeDesc.smCountTarget": ("sm_count_target", int),
    "preference.smCountTarget": ("sm_count_target", int),
}
# dotted key → ((operand, attribute), converter) of the matrix layouts
_DESCS = (("a", "Adesc"), ("b", "Bdesc"), ("c", "Cdesc"), ("d", "Ddesc"))
_DIMS = {f"{desc}.{attr}": ((letter, attr), None if attr == "type" else int) for letter, desc in _DESCS
         for attr in ("type", "rows", "cols", "ld", "batchCount")}
# The values of algo config attributes cuBLASLt leaves out of the line (their enum value 0, or 1 split).
_ALGO_DEFAULTS = (("tile", "UNDEFINED"), ("algo_stages", "UNDEFINED"), ("cluster", "AUTO"), ("num_splits_k", 1),
                  ("reduction_scheme", "NONE"), ("custom_option", 0), ("cta_swizzling", 0))


# dotted key → (is a layout attribute, field or (operand, attribute), converter), and the same split by
# group ("Adesc." → {"rows": ...}) for the one-pass tokenizer
_SPEC = {**{k: (False, name, conv) for k, (name, conv) in _FIELDS.items()},
         **{k: (True, target, conv) for k, (target, conv) in _DIMS.items()}}
_SPEC_BY_GROUP: dict = {}
for _k, _v in _SPEC.items():
    _g, _, _key = _k.rpartition(".")
    _SPEC_BY_GROUP.setdefault(_g + "." if _g else "", {})[_key] = _v
_NO_SPEC: dict = {}


def _assign(f: dict, extra: dict, dims: dict, key: str, value: str, spec) -> None:
    """Store one (dotted key, value): converted in its field or layout attribute, or verbatim in `extra`
    (an unknown key, a repeated one, or a value this version spells differently)."""
    if spec is not None:
        is_dim, target, conv = spec
        d = dims if is_dim else f
        if target not in d:
            if conv is None:
                d[target] = value
                return
            try:
                d[target] = conv(value)
                return
            except ValueError:
                pass
    if key in extra:
        _put_extra(extra, key, value)
    else:
        extra[key] = value


def _assign_pairs(pairs: list) -> tuple[dict, dict, dict]:
    f: dict = {}
    extra: dict = {}
    dims: dict = {}
    get = _SPEC.get
    for key, value in pairs:
        _assign(f, extra, dims, key, value, get(key))
    return f, extra, dims


def _assign_fast(body: str):
    """``(fields, extra, dims, groups)`` in one pass over a body of ``key=value`` items, or None when
    `scan` must decide (a bare value, a stray bracket, a tab or control character).

    Equivalent to ``_assign_pairs(flatten(body))`` (tests/test_logs.py checks it on every fixture line),
    only faster: split on spaces with string methods, one table per group, no intermediate list.
    """
    if not body.isprintable():
        return None
    f: dict = {}
    extra: dict = {}
    dims: dict = {}
    groups: list = []
    stack: list = []
    prefix = ""
    table = _SPEC_BY_GROUP[""]
    count = 0
    for tok in body.split(" "):
        if not tok:
            continue
        closes = 0
        if "[" in tok or "]" in tok:
            while True:  # "Adesc=[type=R_16BF", "n=[p=[q=1]]", "e=[]": open the groups first
                key, sep, value = tok.partition("=")
                if not (sep and value[:1] == "[" and key.isidentifier()):
                    break
                if not stack:
                    groups.append(key)
                stack.append((prefix, table, count, key))
                prefix = prefix + key + "."
                table = _SPEC_BY_GROUP.get(prefix, _NO_SPEC)
                tok = value[1:]
            core = tok.rstrip("]")
            closes = len(tok) - len(core)
            if "[" in core or "]" in core:
                return None
            tok = core
        if tok:
            key, sep, value = tok.partition("=")
            if not sep or not key.isidentifier():
                return None
            count += 1
            spec = table.get(key)
            if spec is not None:  # (the same as `_assign`, inlined)
                is_dim, target, conv = spec
                d = dims if is_dim else f
                if target not in d:
                    if conv is None:
                        d[target] = value
                        spec = True
                    else:
                        try:
                            d[target] = conv(value)
                            spec = True
                        except ValueError:
                            pass
            if spec is not True:
                key = prefix + key
                if key in extra:
                    _put_extra(extra, key, value)
                else:
                    extra[key] = value
        for _ in range(closes):  # then close them
            if not stack:
                return None
            outer, outer_table, n, key = stack.pop()
            if count == n:  # an empty group
                _put_extra(extra, outer + key, "[]")
                count += 1
            prefix, table = outer, outer_table
    if stack:
        return None
    return f, extra, dims, groups


def _flatten_tree(items: list, prefix: str, pairs: list, groups: list | None) -> None:
    for key, value in items:
        if isinstance(value, list):
            if groups is not None:
                groups.append(key)
            n = len(pairs)
            _flatten_tree(value, f"{prefix}{key}.", pairs, None)
            if len(pairs) == n:
                pairs.append((prefix + key, "[]"))
        else:
            pairs.append((prefix + key, value))


def flatten(body: str, offset: int = 0) -> tuple[list[tuple[str, str]], list[str]]:
    """``(pairs, groups)``: the body as (dotted key, value) pairs (``Adesc=[rows=4096]`` →
    ``("Adesc.rows", "4096")``) and the names of its top-level ``[...]`` groups. Raises `DamagedLine` like
    `scan`."""
    pairs: list = []
    groups: list = []
    _flatten_tree(scan(body, offset), "", pairs, groups)
    return pairs, groups


def _put_extra(extra: dict, key: str, value: str) -> None:
    if key in extra:
        i = 2
        while f"{key}#{i}" in extra:
            i += 1
        key = f"{key}#{i}"
    extra[key] = value


# One function on purpose: every parsed log line passes through it (the parser's hot path, bench_parse_log.py).
def build_record(time: str | None, pid: int | None, tag: str, function: str, body: str, *,
                 line: int = 0, source: str | None = None, library: str = "cublasLt",
                 offset: int = 0) -> LogRecord:
    """Build the record of one line from its parts; raises `DamagedLine` when the line is damaged."""
    kind = tag.lower()
    fast = _assign_fast(body)
    if fast is not None:
        f, extra, dims, groups = fast
    else:
        try:
            pairs, groups = flatten(body, offset)
        except DamagedLine:
            if kind in ("trace", "api"):
                raise
            # Info/Hints/Error lines may be free text: keep the message only
            return LogRecord(line, time, pid, LEVELS.get(tag), kind, function, file=source, message=body)
        f, extra, dims = _assign_pairs(pairs)
    if library != "cublasLt":
        extra["library"] = library
    batch = None
    has_desc = False
    for letter, desc in _DESCS:
        if desc not in groups:
            continue
        has_desc = True
        t = dims.get((letter, "type"))
        if t is not None:
            f[f"{letter}_type"] = t
        ld = dims.get((letter, "ld"))
        if ld is not None:
            f[f"ld{letter}"] = ld
        # batch count: Adesc's, else the first descriptor's; one that differs is kept in extra
        b = dims.get((letter, "batchCount"))
        if b is not None:
            if batch is None:
                batch = b
            elif b != batch:
                _put_extra(extra, f"{desc}.batchCount", str(b))
    if batch is not None:
        f["batch_count"] = batch
    if has_desc or "computeDesc" in groups:
        f.setdefault("op_a", "N")
        f.setdefault("op_b", "N")
    has_algo = "algo" in groups
    if has_algo:  # cuBLASLt prints only what differs from the config's zero value
        for name, default in _ALGO_DEFAULTS:
            f.setdefault(name, default)
    # the problem, column-major: op(A) is m×k, op(B) is k×n, D is m×n
    m = n = k = None
    if has_desc:
        get = dims.get
        ar, ac, br, bc = get(("a", "rows")), get(("a", "cols")), get(("b", "rows")), get(("b", "cols"))
        if ar is not None and ac is not None:
            m, k = (ar, ac) if f["op_a"] == "N" else (ac, ar)
        if br is not None and bc is not None:
            kb, n = (br, bc) if f["op_b"] == "N" else (bc, br)
            if k is None:
                k = kb
        if m is None or n is None:
            for letter in ("d", "c"):
                dr, dc = get((letter, "rows")), get((letter, "cols"))
                if m is None and dr is not None:
                    m = dr
                if n is None and dc is not None:
                    n = dc
    if kind == "trace" and _MATMUL_FN.fullmatch(function):
        if m is None or n is None or k is None:
            raise DamagedLine("matmul trace without a complete problem size (Adesc/Bdesc rows, cols)")
        if not has_algo:
            raise DamagedLine("matmul trace without algo=[...] (truncated?)")
    if m is not None:
        f["m"] = m
    if n is not None:
        f["n"] = n
    if k is not None:
        f["k"] = k
    if m is not None and n is not None:
        f["torch_m"], f["torch_n"], f["torch_k"] = n, m, k
    return LogRecord(line, time, pid, LEVELS.get(tag), kind, function, file=source, message=body,
                     extra=extra, **f)


# --- lines ----------------------------------------------------------------------------------------------

def _is_cublas_line(s: str) -> bool:
    return s.startswith(("I!", "i!", "W!", "w!", "E!", "e!"))


def _parse_slow(s: str, lineno: int, source: str | None, api: bool):
    """(record | None, match | None, reason | None) for one line without its line ending."""
    m = _PREFIX.match(s)
    if m is None:
        if not s.strip() or _is_cublas_line(s):
            return None, None, None
        reason = "not a cuBLASLt log line"
        if s.startswith("[") and "][" in s[:60]:
            reason = "damaged cuBLASLt line prefix"
        return None, None, reason
    time, library, pid, tag, function = m.groups()
    kind = tag.lower()
    if not api and not (kind == "trace" and _MATMUL_FN.fullmatch(function)):
        return None, m, None
    try:
        rec = build_record(time, int(pid), tag, function, s[m.end():], line=lineno, source=source,
                           library=library, offset=m.end())
    except DamagedLine as e:
        return None, m, str(e)
    return rec, m, None


def parse_line(line: str, lineno: int = 0, *, source: str | None = None,
               stats: ParseStats | None = None) -> LogRecord | None:
    """The record of one full log line of any kind (trace, api, info, ...), or None.

    None for blank lines, cuBLAS ``I!`` lines and damaged lines; with `stats` the damaged ones are
    counted there with their reason.
    """
    s = line.rstrip("\r\n")
    rec, _, reason = _parse_slow(s, lineno, source, True)
    if stats is not None:
        stats.lines += 1
        if rec is not None:
            stats.records += 1
        elif reason is not None:
            stats.add_bad(source, lineno, reason, s)
        else:
            stats.skipped += 1
    return rec


def parse_message(level: int | str, function: str, message: str, *, line: int = 0,
                  time: str | None = None, pid: int | None = None,
                  source: str | None = None) -> LogRecord | None:
    """The record of a message from the cuBLASLt logger callback ``(level, function, message)``.

    `level` is the callback's int (2 = trace, 5 = api, ...) or the tag (``"Trace"``). Returns None when
    the message is damaged (e.g. a matmul trace without a problem size).
    """
    tag = LEVEL_TAGS.get(level, str(level)) if isinstance(level, int) else level
    body = message.rstrip("\r\n")
    m = _PREFIX.match(body)
    if m is not None:  # a full formatted line was passed: use its parts
        time, _, pid_s, tag, function = m.groups()
        pid, body = int(pid_s), body[m.end():]
    try:
        return build_record(time, pid, tag, function, body, line=line, source=source)
    except DamagedLine:
        return None


_template = attrgetter(*_TEMPLATE_FIELDS)


def _make_fast_constructor():
    """``make(line, time, fields, extra)``: a `LogRecord` from a cached template, without ``__init__``
    (`extra` is copied: records never share it).

    Binding 41 arguments costs more than everything else on a cached line, so the hot path unpacks the
    template tuple straight into the slots (the same trick `dataclasses` uses: code generated from the
    field list, so it cannot drift from it). tests/test_logs.py checks it equals ``__init__``'s record.
    """
    targets = ", ".join(f"self.{name}" for name in _TEMPLATE_FIELDS)
    src = ("def make(line, time, fields, extra, _new=object.__new__, _cls=LogRecord):\n"
           "    self = _new(_cls)\n"
           "    self.line = line\n"
           "    self.time = time\n"
           f"    ({targets},) = fields\n"
           "    self.extra = extra.copy()\n"
           "    return self\n")
    ns: dict = {"LogRecord": LogRecord}
    exec(src, ns)  # code built from our own field names only
    return ns["make"]


_fast_record = _make_fast_constructor()


def _put(cache: dict, key, value) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value


def _iter_lines(lines: Iterable[str], source: str | None, api: bool, stats: ParseStats) -> Iterator[LogRecord]:
    """The records of `lines`. Four bounded caches (cleared when full, so memory stays flat):

    ``full``: the whole line → (time, template fields, extra): a line seen verbatim before.
    ``heads``: ``"[2026-11-30 03:21:52]"`` → the validated time. ``kinds``: ``"[cublasLt][479][Api]
    [cublasLtMatmulDescCreate"`` → wanted or not (lines not asked for are skipped unread).
    ``rest``: the text after the timestamp → (template fields, extra): the same line in another second.
    ``pointer``: that text with its pointer values (``=0X7F...``) cut out → (template fields, extra,
    pointer keys, body offset): the same GEMM on other buffers.
    """
    full: dict = {}
    heads: dict = {}
    kinds: dict = {}
    rest_cache: dict = {}
    pointer: dict = {}
    make = _fast_record
    HEAD = _HEAD
    lineno = skipped = bad = 0
    try:
        for lineno, line in enumerate(lines, 1):
            hit = full.get(line)
            if hit is not None:  # the hot path: a line seen before, verbatim
                yield make(lineno, hit[0], hit[1], hit[2])
                continue
            t = heads.get(line[:HEAD])
            if t is not None:
                rest = line[HEAD:]
                hit = rest_cache.get(rest)
                if hit is not None:  # seen in another second (or with these pointers before)
                    yield make(lineno, t, hit[0], hit[1])
                    continue
                end = line.find("] ", HEAD)
                want = kinds.get(line[HEAD:end]) if end > 0 else None
                if want is False:  # a kind not asked for (Api lines without api=True): not read
                    skipped += 1
                    continue
                if want and "=0" in rest:  # the same GEMM on other buffers?
                    parts = _PTR_SPLIT.split(rest)
                    tpl = pointer.get("\x00".join(parts[::2])) if len(parts) > 1 else None
                    if tpl is not None:
                        fields, extra0, keys, start = tpl
                        extra = dict(extra0)
                        extra.update(zip(keys, parts[1::2]))
                        fields = fields[:-1] + (rest[start:].rstrip("\r\n"),)
                        _put(rest_cache, rest, (fields, extra))
                        yield make(lineno, t, fields, extra)
                        continue
            # a line not seen before in any form: parse it
            s = line.rstrip("\r\n")
            rec, m, reason = _parse_slow(s, lineno, source, api)
            if m is not None and m.start(1) == 1 and m.end(1) == HEAD - 1:
                _put(heads, line[:HEAD], m.group(1))
                _put(kinds, line[HEAD:m.end(5)], rec is not None or (reason is not None))
            if rec is None:
                if reason is None:
                    skipped += 1
                else:
                    bad += 1
                    stats.add_bad(source, lineno, reason, s)
                continue
            if m.start(1) == 1 and m.end(1) == HEAD - 1:
                _remember(line, rec, m, full, rest_cache, pointer)
            yield rec
    finally:
        stats.lines += lineno
        stats.records += lineno - skipped - bad
        stats.skipped += skipped


def _remember(line: str, rec: LogRecord, m: re.Match, full: dict, rest_cache: dict, pointer: dict) -> None:
    """Cache the templates of a freshly parsed line."""
    fields = _template(rec)
    rest = line[_HEAD:]
    extra = dict(rec.extra)
    _put(rest_cache, rest, (fields, extra))
    _put(full, line, (rec.time, fields, extra))
    if "=0" in rest:
        parts = _PTR_SPLIT.split(rest)
        if len(parts) > 1:
            keys = [k for k, v in extra.items() if _PTR_VALUE.fullmatch(v)]
            if [extra[k] for k in keys] == parts[1::2]:
                _put(pointer, "\x00".join(parts[::2]), (fields, extra, keys, m.end() - _HEAD))


def parse_log(source: Source, *, api: bool = False, stats: ParseStats | None = None,
              name: str | None = None) -> Iterator[LogRecord]:
    """Stream the records of one cuBLASLt log.

    `source`: a path (``.gz`` read transparently), an open text or binary file, or an iterable of
    lines. Yields one record per matmul trace line (``cublasLtMatmul`` and the internal legacy-API
    forms such as ``cublasLtTSTMatmul``); with ``api=True`` also every other line (Api, Info, Error,
    Hints, non-matmul traces), told apart by ``kind``. Never raises on a bad line: bad lines are counted
    in `stats` (a `ParseStats`, pass one in to read it afterwards). Raises `LogReadError` when a path
    cannot be opened. `name` overrides the record's ``file`` (default: the path or the file's name).
    """
    st = stats if stats is not None else ParseStats()
    src = name if name is not None else source_name(source)
    with open_lines(source) as lines:
        st.files_read.append(src if src is not None else "<lines>")
        before = st.lines
        try:
            yield from _iter_lines(lines, src, api, st)
        except READ_ERRORS as e:
            raise LogReadError(f"cannot read {src or 'the log'} past line {st.lines - before:,}: "
                               f"{describe_read_error(e)}") from e


def parse_logs(sources: Iterable[Source], *, api: bool = False,
               stats: ParseStats | None = None) -> Iterator[LogRecord]:
    """Stream the records of several logs one after another (e.g. ``app_%i.log`` of many processes).

    ``pid`` tells the processes apart and ``file`` names the file. A file that cannot be read (missing,
    a directory, broken gzip) is recorded in ``stats.files_failed`` and skipped; `LogReadError` is raised
    at the end only when no file at all could be read.
    """
    st = stats if stats is not None else ParseStats()
    return each_source(sources, st, lambda src: parse_log(src, api=api, stats=st))


def each_source(sources: Iterable[Source], st: ParseStats, parse_one) -> Iterator:
    """Chain ``parse_one(source)`` over `sources`, recording unreadable ones in `st` (see `parse_logs`)."""
    sources = list(sources)
    ok = 0
    for source in sources:
        src = source_name(source)
        opened = len(st.files_read)
        try:
            yield from parse_one(source)
        except LogReadError as e:
            reason = str(e)
            for prefix in (f"cannot read {src}: ", f"cannot read {src} "):
                if src is not None and reason.startswith(prefix):
                    reason = reason[len(prefix):]
                    break
            st.files_failed.append((src or "<stream>", reason))
            log.info("%s", e)
        if len(st.files_read) > opened:
            ok += 1  # opened (a gzip cut short still counts: its records were yielded)
    if sources and ok == 0:
        failed = "; ".join(f"{p}: {why}" for p, why in st.files_failed)
        raise LogReadError(f"no log could be read ({failed})")


def load_log(source: Source, *, api: bool = False) -> tuple[list[LogRecord], ParseStats]:
    """All records of one log (see `parse_log`) and the `ParseStats` of the parse."""
    st = ParseStats()
    return list(parse_log(source, api=api, stats=st)), st


def load_logs(sources: Iterable[Source], *, api: bool = False) -> tuple[list[LogRecord], ParseStats]:
    """All records of several logs (see `parse_logs`) and the `ParseStats` of the parse."""
    st = ParseStats()
    return list(parse_logs(sources, api=api, stats=st)), st


def without_pointers(lines) -> list:
    """Log lines without their time stamp and pointer values (``0X7F...``, ``0x7f...``): what one call's lines
    say on any buffers, to compare the lines of the same GEMM from run to run."""
    return [_PTR_VALUE.sub("", _STAMP.sub("", line, count=1)) for line in lines or []]

