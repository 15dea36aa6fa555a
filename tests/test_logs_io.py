"""How the log reader opens what it is given: paths (gzip by its magic bytes), open binary and text files,
iterables of lines; and the one-line reasons it gives when it cannot."""
from __future__ import annotations

import gzip
import io
import os
from pathlib import Path

import pytest

from cublaslt_probe.logs import LogReadError, ParseStats, parse_log, parse_logs

LOG = Path(__file__).resolve().parent / "fixtures" / "logs" / "level2_torch.log"


def _keys(records):
    return [(r.function, r.m, r.n, r.k, r.algo_id) for r in records]


@pytest.fixture(scope="module")
def expected():
    recs = list(parse_log(LOG))
    assert len(recs) > 3
    return _keys(recs)


def test_every_kind_of_source_reads_the_same_records(expected, tmp_path):
    data = LOG.read_bytes()
    gz = tmp_path / "renamed.log"                      # gzip found by its magic bytes, not its suffix
    gz.write_bytes(gzip.compress(data))
    assert _keys(parse_log(gz)) == expected
    assert _keys(parse_log(io.BytesIO(gzip.compress(data)))) == expected      # an open gzip stream
    raw = io.BytesIO(data)
    assert _keys(parse_log(raw)) == expected and not raw.closed               # the caller's file stays open
    assert _keys(parse_log(io.StringIO(data.decode()))) == expected
    assert _keys(parse_log(data.decode().splitlines())) == expected
    assert _keys(parse_log(data.splitlines())) == expected                   # lines as bytes


def test_a_binary_file_that_cannot_peek_or_seek_is_still_read(expected):
    class Pipe(io.RawIOBase):                     # a pipe's read end: no peek, no seek
        def __init__(self, data):
            self._b = io.BytesIO(data)

        def readable(self):
            return True

        def readinto(self, buf):
            n = self._b.readinto(buf)
            return n

    assert _keys(parse_log(io.BufferedReader(Pipe(LOG.read_bytes())))) == expected
    assert _keys(parse_log(Pipe(LOG.read_bytes()))) == expected


@pytest.mark.parametrize("make, why", [
    (lambda d: d / "missing.log", "no such file"),
    (lambda d: d, "is a directory"),
    (lambda d: _write(d / "cut.log.gz", gzip.compress(LOG.read_bytes())[:40]), "broken gzip data"),
])
def test_a_path_that_cannot_be_read_says_why_in_one_line(tmp_path, make, why):
    path = make(tmp_path)
    with pytest.raises(LogReadError, match=f"{os.path.basename(path)}.*{why}") as e:
        list(parse_log(path))
    assert "\n" not in str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file_says_permission_denied(tmp_path):
    p = _write(tmp_path / "locked.log", LOG.read_bytes())
    p.chmod(0)
    with pytest.raises(LogReadError, match="permission denied"):
        list(parse_log(p))


@pytest.mark.parametrize("source, why", [(b"[2026-11-30][cublasLt]", "got bytes"), (42, "cannot read int")])
def test_a_source_that_is_not_a_log_is_refused(source, why):
    with pytest.raises(LogReadError, match=why):
        list(parse_log(source))


def test_of_several_logs_the_readable_ones_are_read_and_the_others_counted(tmp_path, expected):
    st = ParseStats()
    recs = list(parse_logs([tmp_path / "missing.log", LOG], stats=st))
    assert _keys(recs) == expected
    assert len(st.files_failed) == 1 and "no such file" in str(st.files_failed[0])


def _write(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p
