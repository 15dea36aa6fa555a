"""Property tests of the log parser on bad input built from real lines.

Truncated lines, lines cut inside ``[...]``, spliced lines, binary garbage, CRLF endings, interleaved
processes, random damage: the parser never raises, good lines are still parsed (identically), bad lines
are counted, and the counts add up.
"""
from __future__ import annotations

import gzip
import io
import random

from conftest import FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cublaslt_probe.logs import LogReadError, ParseStats, parse_cublas_log, parse_line, parse_log
from cublaslt_probe.logs.record import ALGO_FIELDS, PROBLEM_FIELDS

LOGS = FIXTURES / "logs"


def _lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


# a few hundred real lines of every kind: matmul traces (both paths), Api, Info
TRACE_LINES = _lines("level2_mixed.log") + _lines("level2_torchlt.log")[:40] + _lines("level2_torch.log")[:40]
ALL_LINES = TRACE_LINES + _lines("level5_torch.log")
CUBLAS_LINES = _lines("cublas_api.log")
KEY_VALUE_LINES = [x for x in ALL_LINES if "][Trace][" in x or "][Api][" in x]
KEY_FIELDS = ("pid", "level", "kind") + PROBLEM_FIELDS + ALGO_FIELDS

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

real_line = st.sampled_from(ALL_LINES)
trace_line = st.sampled_from(TRACE_LINES)
# garbage: bytes that are not a line ending, decoded the way the parser decodes files
garbage = st.binary(min_size=1, max_size=200).map(
    lambda b: b.replace(b"\n", b" ").replace(b"\r", b" ").decode("utf-8", "replace"))


def _key(rec) -> tuple:
    return tuple(getattr(rec, f) for f in KEY_FIELDS)


def _consistent(stats: ParseStats) -> None:
    assert stats.lines == stats.records + stats.skipped + stats.bad
    assert len(stats.bad_lines) == min(stats.bad, stats.max_examples)


@SETTINGS
@given(line=trace_line, data=st.data())
def test_truncated_line_is_bad_or_agrees(line, data):
    """A prefix of a trace line is rejected, or (cut after algo=[...]) agrees on problem and algo."""
    full = parse_line(line)
    cut = data.draw(st.integers(1, len(line)))
    stats = ParseStats()
    rec = parse_line(line[:cut], 1, stats=stats)
    _consistent(stats)
    if rec is not None:
        assert _key(rec) == _key(full)
        assert line[:cut].find("algo=[") >= 0
    if "algo=[" in line and cut < line.index("]", line.index("algo=[")):
        assert rec is None and stats.bad == 1  # cut before the algo is complete


@SETTINGS
@given(line=trace_line, data=st.data())
def test_cut_inside_brackets_is_bad(line, data):
    opens = [i for i, c in enumerate(line) if c == "["][5:]  # skip the five prefix brackets
    pos = data.draw(st.sampled_from(opens))
    end = line.index("]", pos)
    cut = data.draw(st.integers(pos + 1, end))
    stats = ParseStats()
    assert parse_line(line[:cut], 9, stats=stats) is None
    assert stats.bad == 1 and stats.bad_lines[0].line == 9


@SETTINGS
@given(a=st.sampled_from(KEY_VALUE_LINES), b=real_line, data=st.data())
def test_spliced_lines_are_bad(a, b, data):
    """Two processes writing to one stream without locking: the tail of a line glued onto another.

    (Info lines may hold free text, so a line glued onto one is still a well-formed Info line.)
    """
    cut = data.draw(st.integers(1, len(a)))
    stats = ParseStats()
    assert parse_line(a[:cut] + b, 1, stats=stats) is None
    assert stats.bad == 1


@SETTINGS
@given(items=st.lists(st.one_of(real_line.map(lambda x: ("good", x)), garbage.map(lambda x: ("junk", x))),
                      max_size=40))
def test_good_lines_survive_garbage(items):
    stats = ParseStats()
    recs = list(parse_log([x for _, x in items], api=True, stats=stats))
    want = [(i, parse_line(x, i)) for i, (kind, x) in enumerate(items, 1) if kind == "good"]
    assert [(r.line, _key(r)) for r in recs] == [(i, _key(r)) for i, r in want]
    _consistent(stats)
    assert stats.records == len(want)


@SETTINGS
@given(blob=st.binary(max_size=4000))
def test_binary_file_never_raises(blob, tmp_path_factory):
    p = tmp_path_factory.mktemp("fuzz") / "blob.log"
    p.write_bytes(blob)
    stats = ParseStats()
    try:
        recs = list(parse_log(p, api=True, stats=stats))
    except LogReadError as e:  # a file-level error, not a line's: only for data that claims to be gzip
        assert blob[:2] == b"\x1f\x8b" and "broken gzip" in str(e)
        return
    _consistent(stats)
    assert stats.records == len(recs)
    cstats = ParseStats()
    list(parse_cublas_log(io.BytesIO(blob), stats=cstats))
    assert cstats.lines >= 0


@SETTINGS
@given(lines=st.lists(real_line, min_size=1, max_size=30), ending=st.sampled_from(["\n", "\r\n"]),
       final=st.booleans(), gz=st.booleans())
def test_line_endings_and_gzip(lines, ending, final, gz):
    data = (ending.join(lines) + (ending if final else "")).encode()
    if gz:
        data = gzip.compress(data)
    recs = list(parse_log(io.BytesIO(data), api=True))
    want = [parse_line(x, i) for i, x in enumerate(lines, 1)]
    assert [r.to_dict() for r in recs] == [w.to_dict() for w in want if w is not None]


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_interleaved_processes(seed):
    """Lines of two processes in one file, in any interleaving: per pid, the same records in order."""
    a, b = _lines("level2_torch.log")[:30], _lines("level2_torchlt.log")[:30]
    rng = random.Random(seed)
    merged, ia, ib = [], 0, 0
    while ia < len(a) or ib < len(b):
        if ib >= len(b) or (ia < len(a) and rng.random() < 0.5):
            merged.append(a[ia])
            ia += 1
        else:
            merged.append(b[ib])
            ib += 1
    recs = list(parse_log(merged))
    by_pid: dict = {}
    for r in recs:
        by_pid.setdefault(r.pid, []).append(_key(r))
    assert by_pid == {479: [_key(parse_line(x)) for x in a], 501: [_key(parse_line(x)) for x in b]}


@SETTINGS
@given(line=real_line, data=st.data())
def test_random_damage_never_raises(line, data):
    chars = list(line)
    for _ in range(data.draw(st.integers(1, 5))):
        i = data.draw(st.integers(0, len(chars) - 1))
        chars[i] = data.draw(st.sampled_from(list("[]= \t\x00\ufffdX0\\\"'")))
    damaged = "".join(chars)
    stats = ParseStats()
    rec = parse_line(damaged, 1, stats=stats)
    _consistent(stats)
    # the stream (with its caches) agrees with the single-line parse
    again = [r for r in parse_log([line, damaged, damaged], api=True) if r.line > 1]
    want = [parse_line(damaged, 2), parse_line(damaged, 3)] if rec is not None else []
    assert [r.to_dict() for r in again] == [r.to_dict() for r in want]


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_varying_pointers_and_times_match_fresh_parse(seed):
    """The caches (whole line, text after the time, pointer template) never change a record."""
    rng = random.Random(seed)
    base = rng.sample(TRACE_LINES, 5)
    lines = []
    for _ in range(40):
        x = rng.choice(base)
        if rng.random() < 0.5:  # another second
            x = x[:18] + f"{rng.randrange(60):02d}" + x[20:]
        if rng.random() < 0.5:  # other pointers
            x = x.replace("0X7F", f"0X{rng.randrange(16):X}F", rng.randrange(1, 6))
        lines.append(x)
    recs = list(parse_log(lines))
    assert [r.to_dict() for r in recs] == [parse_line(x, i).to_dict() for i, x in enumerate(lines, 1)]


@SETTINGS
@given(lines=st.lists(st.one_of(st.sampled_from(CUBLAS_LINES), garbage), max_size=60))
def test_cublas_log_never_raises(lines):
    stats = ParseStats()
    calls = list(parse_cublas_log(lines, stats=stats))
    assert stats.records == len(calls)
    assert stats.lines == len(lines)
    for c in calls:
        assert c.function and isinstance(c.args, list)


def test_empty_inputs(tmp_path):
    p = tmp_path / "empty.log"
    p.write_text("")
    stats = ParseStats()
    assert list(parse_log(p, stats=stats)) == []
    assert (stats.lines, stats.records, stats.bad, stats.files_read) == (0, 0, 0, [str(p)])
    assert list(parse_log([])) == [] and list(parse_cublas_log([])) == []
