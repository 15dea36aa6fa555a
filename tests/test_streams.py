"""One gzip-sniffing open (streams.py) for every command: gzip by its magic bytes, never its suffix, and a cut
gzip stream keeps everything before the cut in each reader. Real data: the probe's raw records
(tests/fixtures/probe/probe_raw.jsonl), a cuBLASLt log and a program's trace, gzipped and cut at test time."""
from __future__ import annotations

import gzip
import pathlib
import re

import pandas as pd
from click.testing import CliRunner
from conftest import FIXTURES

import cublaslt_probe
from cublaslt_probe import sweep
from cublaslt_probe.analysis.trace import TraceStats, iter_chrome_events
from cublaslt_probe.cli import main
from cublaslt_probe.logs import ParseStats, parse_logs

RAW = FIXTURES / "probe" / "probe_raw.jsonl"
PACKAGE = pathlib.Path(cublaslt_probe.__file__).parent


def _cut_gzip(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    full = gzip.compress(src.read_bytes())
    dst.write_bytes(full[: len(full) // 2])
    return dst


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_merge_and_dataset_keep_the_same_records_of_a_cut_gzip_raw_file(tmp_path):
    """Both commands keep every complete record before the cut, the same ones, and exit 3 saying the file is
    cut: the sweep's reader sniffs gzip and reads a cut stream as `dataset`'s does (never an internal error)."""
    cut = _cut_gzip(RAW, tmp_path / "cut.raw.jsonl.gz")
    r = _run("dataset", cut, "-o", tmp_path / "d.parquet")
    assert r.exit_code == 3 and "cut off after line" in r.stderr, r.output
    kept = pd.read_parquet(tmp_path / "d.parquet")
    assert 100 < len(kept) < RAW.read_text().count("\n")
    r = _run("merge", cut, "-o", tmp_path / "m.parquet")
    assert r.exit_code == 3 and "internal error" not in r.output, r.output   # partial input: exit 3, said
    assert f"{cut}: the gzip stream ends early" in r.stderr, r.output
    merged = pd.read_parquet(tmp_path / "m.parquet")
    assert sorted(merged.key) == sorted(kept.key)
    assert [k for k in sweep.raw_keys(str(cut)) if k is not None] == list(kept.key)


def test_a_plain_raw_file_named_gz_reads_as_what_it_is(tmp_path):
    """The sweep's reader sniffs like the dataset's: a plain file named .gz is plain text."""
    plain = tmp_path / "plain.raw.jsonl.gz"
    plain.write_bytes(RAW.read_bytes())
    n = RAW.read_text().count("\n")
    assert sum(1 for k in sweep.raw_keys(str(plain)) if k) == n
    r = _run("merge", plain, "-o", tmp_path / "m.parquet")
    assert r.exit_code == 0 and len(pd.read_parquet(tmp_path / "m.parquet")) == n, r.output


def test_log_and_trace_readers_keep_what_precedes_a_cut(tmp_path):
    """The log reader counts the cut as a broken file and keeps the complete lines before it; the trace
    reader keeps the events before it: both read the same bytes through the same gzip reader."""
    log = FIXTURES / "logs" / "level2_torch.log"
    text = log.read_text()
    big = tmp_path / "big.log"
    big.write_text(text * 20)
    cut = _cut_gzip(big, tmp_path / "cut.log.gz")
    st = ParseStats()
    recs = list(parse_logs([cut], stats=st))
    got = []
    with gzip.open(cut, "rt") as f:      # what Python's own gzip reader gets out of the cut file
        try:
            for ln in f:
                got.append(ln)
        except EOFError:
            pass
    before = tmp_path / "before_the_cut.log"
    before.write_text("".join(ln for ln in got if ln.endswith("\n")))
    assert st.files_failed and "broken gzip" in st.files_failed[0][1]
    assert 0 < len(recs) == len(list(parse_logs([before]))) < len(list(parse_logs([big])))
    # the trace fixture is gzip already: decompress it, so that the cut file holds a cut trace
    trace = tmp_path / "t.json"
    trace.write_bytes(gzip.decompress((FIXTURES / "traces" / "transformer_bf16.json.gz").read_bytes()))
    tst = TraceStats(path="cut", format="chrome")
    n = sum(1 for _ in iter_chrome_events(_cut_gzip(trace, tmp_path / "cut.json.gz"), stats=tst))
    assert n > 0 and tst.truncated


def test_no_module_decides_gzip_by_itself():
    """Reading gzip goes through streams.py. Left: a gzip *writer* (recorder) and the log reader's branch for a
    caller's open file (`GzipFile(fileobj=...)` leaves that file open; `streams.Gunzip` closes what it reads)."""
    own = re.compile(r'gzip\.open\(|GzipFile\(|\\x1f\\x8b|endswith\("\.gz"\)|zlib\.decompressobj')
    found = {f"{p.relative_to(PACKAGE)}" for p in PACKAGE.rglob("*.py") if p.name != "streams.py"
             for line in p.read_text().splitlines() if own.search(line)}
    assert found == {"gpu/recorder.py", "logs/_io.py"}
    assert all('"wb"' in ln for ln in (PACKAGE / "gpu" / "recorder.py").read_text().splitlines() if own.search(ln))
    assert all("fileobj=source" in ln for ln in (PACKAGE / "logs" / "_io.py").read_text().splitlines()
               if own.search(ln))
