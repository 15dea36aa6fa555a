"""Table-driven fuzz of every CPU command (and the --from side of the GPU commands) with hostile inputs.

Each file argument of each command is fed: an empty file, a truncated file (plain and gzip) of the kind the
command reads, random bytes, a file of the wrong kind, files of two environments, and an oversized line;
each output is an unwritable path, and (in a real process) a pipe closed early. For every run:

- no traceback, and no "internal error" (the command group's last line of defence must never be reached);
- exit status per docs/cli.md: 0 all good, 1 nothing usable, 2 usage error, 3 partial;
- exit 1 is exactly one ``Error:`` line on stderr that names the input (or output) and says what to do;
- no good record lost: where part of an input is readable, the output holds every complete record of it.

The inputs are cut, compressed, mixed or padded from the real fixtures and shipped data (PROVENANCE.md in
tests/fixtures/* and data/); nothing here pretends to be a capture.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
LOG = FIXTURES / "logs" / "level2_torch.log"
TRACE = FIXTURES / "traces" / "fp8_linear.json.gz"
EVIDENCE = FIXTURES / "evidence"
FIX_WORDS = re.compile(r"\b(give|use|pass|add|choose|build|rebuild|drop|write|reads it|run|reinstall|name|"
                       r"create|check|set|pip install|capture|merge)\b", re.I)


def _raw_lines(n: int, name: str = "h200_square") -> list[str]:
    with gzip.open(DATA / f"{name}.raw.jsonl.gz", "rt") as f:
        return [next(f) for _ in range(n)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Every hostile input, built once from the real files."""
    d = tmp_path_factory.mktemp("fuzz")
    rng = random.Random(7)
    f = {}

    def put(name, data: bytes):
        p = d / name
        p.write_bytes(data)
        f[name] = p
        return p

    log = LOG.read_bytes()
    raw = "".join(_raw_lines(120)).encode()
    trace = gzip.decompress(TRACE.read_bytes())
    pq_bytes = (DATA / "h200_square.parquet").read_bytes()
    put("empty", b"")
    put("random.bin", bytes(rng.getrandbits(8) for _ in range(30_000)).replace(b"\x1f\x8b", b"ab"))
    put("log.log", log)
    put("log_cut.log", log[: len(log) // 2 + 37])
    put("log_cut.log.gz", gzip.compress(log * 30)[: len(gzip.compress(log * 30)) // 2])
    put("raw.raw.jsonl", raw)
    put("raw_cut.raw.jsonl", raw[: len(raw) // 2 + 11])
    gz_raw = gzip.compress("".join(_raw_lines(1500)).encode())
    put("raw_cut.raw.jsonl.gz", gz_raw[: len(gz_raw) // 2])
    put("trace_cut.json", trace[: len(trace) // 2])
    put("trace_cut.json.gz", gzip.compress(trace)[: len(gzip.compress(trace)) // 2])
    put("dataset_cut.parquet", pq_bytes[: len(pq_bytes) // 2])
    put("names.txt", b"".join(json.loads(x)["kernel"].encode() + b"\n"
                              for x in (FIXTURES / "names" / "names.jsonl").read_text().splitlines()[:200]))
    put("names_cut.txt", f["names.txt"].read_bytes()[:1000])
    # oversized: one 4 MB line among good ones
    big = b"x" * 4_000_000
    put("log_big.log", log + big + b"\n" + log)
    put("raw_big.raw.jsonl", raw + b'{"key": "' + big + b'"}\n')
    put("names_big.txt", b"nvjet_sm90_tst_" + b"9" * 5000 + b"x128_64x4_1x2_h_bz_coopA_TNT\n" + big + b"\n")
    # two environments: raw files and datasets whose GPU differs
    lines = _raw_lines(40, "h200_llm")
    env = json.loads(lines[0])
    env["gpu"] = "NVIDIA H100 80GB HBM3"
    put("raw_h100.raw.jsonl", (json.dumps(env) + "\n" + "".join(lines[1:])).encode())
    from cublaslt_probe.analysis.dataset import read_parquet, write_parquet
    df = read_parquet(DATA / "h200_square.parquet").head(300)
    e = dict(df.attrs["env"], gpu="NVIDIA H100 80GB HBM3")
    df["gpu"] = pd.Categorical(["NVIDIA H100 80GB HBM3"] * len(df))
    p = d / "h100.parquet"
    write_parquet(df, p, e)
    f["h100.parquet"] = p
    r = CliRunner().invoke(main, ["parse-log", str(LOG), "-o", str(d / "records.parquet")])
    assert r.exit_code == 0
    f["records.parquet"] = d / "records.parquet"
    f["square.parquet"] = DATA / "h200_square.parquet"
    f["trace.json.gz"] = TRACE
    for name in ("candidates_bf16_256x4096x4096.json", "firstcall_bf16_NT_16x4096x4096.json",
                 "explain_bf16_NT_16x4096x4096.json", "replay_level2_torch.json"):
        f[name.split("_")[0]] = EVIDENCE / name
    f["dir"] = d
    return f


@dataclass(frozen=True)
class Case:
    cmd: tuple           # arguments; "{name}" is replaced by the path of that input
    exits: tuple         # allowed exit statuses
    stdin: str | None = None
    count: str | None = None  # how to count the good records the output must hold (see _expected)

    def argv(self, f, out: Path) -> list[str]:
        return [str(f[a[1:-1]]) if a.startswith("{") and a.endswith("}") else a.replace("OUT", str(out))
                for a in self.cmd]


NOTHING, OK, PARTIAL = (1,), (0,), (3,)
CASES = {
    # parse-log
    "parse-log empty": Case(("parse-log", "{empty}"), NOTHING),
    "parse-log random": Case(("parse-log", "{random.bin}"), NOTHING),
    "parse-log png-ish wrong type (parquet)": Case(("parse-log", "{square.parquet}"), NOTHING),
    "parse-log wrong type (trace)": Case(("parse-log", "{trace.json.gz}"), NOTHING),
    "parse-log cut plain": Case(("parse-log", "{log_cut.log}", "-f", "jsonl"), PARTIAL, count="log_cut.log"),
    "parse-log cut gzip": Case(("parse-log", "{log_cut.log.gz}", "-f", "jsonl"), PARTIAL, count="gz:log_cut.log.gz"),
    "parse-log oversized line": Case(("parse-log", "{log_big.log}", "-f", "csv"), OK + PARTIAL, count="log_big.log"),
    "parse-log cublas of a lt log": Case(("parse-log", "--cublas", "{log.log}"), NOTHING),
    "parse-log summary of empty": Case(("parse-log", "--summary", "{empty}"), NOTHING),
    "parse-log unwritable": Case(("parse-log", "{log.log}", "-o", "/nonexistent/x.csv"), NOTHING),
    "parse-log parquet to a dir": Case(("parse-log", "{log.log}", "-o", "{dir}"), (1, 2)),
    # trace
    "trace empty": Case(("trace", "{empty}"), NOTHING),
    "trace random": Case(("trace", "{random.bin}"), NOTHING),
    "trace wrong type (log)": Case(("trace", "{log.log}"), NOTHING),
    "trace wrong type (parquet)": Case(("trace", "{square.parquet}"), NOTHING),
    "trace cut plain": Case(("trace", "{trace_cut.json}"), PARTIAL),
    "trace cut gzip": Case(("trace", "{trace_cut.json.gz}"), PARTIAL + NOTHING),
    "trace unwritable": Case(("trace", "{trace.json.gz}", "-o", "/nonexistent/x.jsonl"), NOTHING),
    # decode
    "decode empty stdin": Case(("decode", "-"), OK, stdin="empty"),
    "decode random stdin": Case(("decode", "-f", "jsonl", "-"), OK + PARTIAL, stdin="random.bin",
                                count="lines:random.bin"),
    "decode cut names": Case(("decode", "-f", "csv", "-"), OK, stdin="names_cut.txt", count="lines:names_cut.txt"),
    "decode oversized names": Case(("decode", "-"), OK, stdin="names_big.txt", count="table:names_big.txt"),
    "decode unwritable": Case(("decode", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "-o", "/nonexistent/x"),
                              NOTHING),
    # dataset
    "dataset empty": Case(("dataset", "{empty}", "-o", "OUT.parquet"), NOTHING),
    "dataset random": Case(("dataset", "{random.bin}", "-o", "OUT.parquet"), NOTHING),
    "dataset wrong type (dataset)": Case(("dataset", "{square.parquet}", "-o", "OUT.parquet"), NOTHING),
    "dataset wrong type (log)": Case(("dataset", "{log.log}", "-o", "OUT.parquet"), NOTHING),
    "dataset cut plain": Case(("dataset", "{raw_cut.raw.jsonl}", "-o", "OUT.parquet"), PARTIAL,
                              count="raw:raw_cut.raw.jsonl"),
    "dataset cut gzip": Case(("dataset", "{raw_cut.raw.jsonl.gz}", "-o", "OUT.parquet"), PARTIAL,
                             count="raw:raw_cut.raw.jsonl.gz"),
    "dataset two environments": Case(("dataset", "{raw.raw.jsonl}", "{raw_h100.raw.jsonl}", "-o", "OUT.parquet"),
                                     NOTHING),
    "dataset oversized line": Case(("dataset", "{raw_big.raw.jsonl}", "-o", "OUT.parquet"), PARTIAL,
                                   count="raw:raw.raw.jsonl"),
    "dataset bad --env": Case(("dataset", "{raw.raw.jsonl}", "--env", "{random.bin}", "-o", "OUT.parquet"), NOTHING),
    "dataset unwritable": Case(("dataset", "{raw.raw.jsonl}", "-o", "/nonexistent/x.parquet"), NOTHING),
    # merge
    "merge empty": Case(("merge", "{empty}", "-o", "OUT.parquet"), NOTHING),
    "merge random": Case(("merge", "{random.bin}", "-o", "OUT.parquet"), NOTHING),
    "merge wrong type (parse-log parquet)": Case(("merge", "{records.parquet}", "-o", "OUT.parquet"), NOTHING),
    "merge cut parquet": Case(("merge", "{dataset_cut.parquet}", "-o", "OUT.parquet"), NOTHING),
    "merge two environments": Case(("merge", "{square.parquet}", "{h100.parquet}", "-o", "OUT.parquet"), NOTHING),
    "merge unwritable": Case(("merge", "{square.parquet}", "-o", "/nonexistent/x.parquet"), NOTHING),
    # map / plot / report
    "map empty": Case(("map", "{empty}", "-o", "OUT.png"), NOTHING),
    "map random": Case(("map", "{random.bin}", "-o", "OUT.png"), NOTHING),
    "map wrong type (log)": Case(("map", "{log.log}", "-o", "OUT.png"), NOTHING),
    "map wrong type (records)": Case(("map", "{records.parquet}", "-o", "OUT.png"), NOTHING),
    "map cut parquet": Case(("map", "{dataset_cut.parquet}", "-o", "OUT.png"), NOTHING),
    "map unwritable": Case(("map", "{square.parquet}", "-o", "/nonexistent/x.png"), NOTHING),
    "plot random": Case(("plot", "tflops", "{random.bin}", "-o", "OUT.png"), NOTHING),
    "plot wrong type (raw)": Case(("plot", "heuristic", "{raw.raw.jsonl}", "-o", "OUT.png"), NOTHING),
    "plot pathdiff other random": Case(("plot", "pathdiff", "{square.parquet}", "--other", "{random.bin}",
                                        "-o", "OUT.png"), NOTHING),
    "plot unwritable": Case(("plot", "tflops", "{square.parquet}", "-o", "/nonexistent/x.png"), NOTHING),
    "report random": Case(("report", "{random.bin}", "-o", "OUT"), NOTHING),
    "report cut parquet": Case(("report", "{dataset_cut.parquet}", "-o", "OUT"), NOTHING),
    "report unwritable": Case(("report", "{square.parquet}", "-o", "/proc/nonexistent/r"), NOTHING),
    # diff
    "diff empty": Case(("diff", "{empty}", "{square.parquet}"), NOTHING),
    "diff random": Case(("diff", "{square.parquet}", "{random.bin}"), NOTHING),
    "diff wrong type (records)": Case(("diff", "{records.parquet}", "{square.parquet}"), NOTHING),
    "diff two environments": Case(("diff", "{square.parquet}", "{h100.parquet}"), NOTHING),
    "diff unwritable": Case(("diff", "{square.parquet}", "{square.parquet}", "-o", "/nonexistent/x.csv"), NOTHING),
    # --from of the GPU commands
    "candidates --from empty": Case(("candidates", "--from", "{empty}"), NOTHING),
    "candidates --from random": Case(("candidates", "--from", "{random.bin}"), NOTHING),
    "candidates --from first-call file": Case(("candidates", "--from", "{firstcall}"), NOTHING),
    "first-call --from explain file": Case(("first-call", "--from", "{explain}"), NOTHING),
    "first-call --from cut": Case(("first-call", "--from", "{raw_cut.raw.jsonl}"), NOTHING),
    "explain --from replay file": Case(("explain", "--from", "{replay}"), NOTHING),
    "explain --from parquet": Case(("explain", "--from", "{square.parquet}"), NOTHING),
    "replay --from candidates file": Case(("replay", "--from", "{candidates}"), NOTHING),
    "replay --from random": Case(("replay", "--from", "{random.bin}"), NOTHING),
    "replay log without GPU": Case(("replay", "{empty}", "--all"), NOTHING),
    # audit (a trace and its log)
    "audit random": Case(("audit", "{random.bin}"), NOTHING),
    "audit wrong type (log)": Case(("audit", "{log.log}"), NOTHING),
    "audit empty": Case(("audit", "{empty}"), NOTHING),
}


def _expected(spec: str, f) -> int:
    """The number of good records an input holds, counted apart from the command under test."""
    kind, _, name = spec.rpartition(":")
    p = f[name]
    if kind == "gz" or p.suffix == ".gz":  # all that zlib can decompress of a cut stream
        text = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(p.read_bytes())
    else:
        text = p.read_bytes()
    lines = text.split(b"\n")
    complete = lines[:-1]  # the last piece has no line end: cut, unless empty
    if kind in ("", "gz"):
        return sum(1 for x in complete if b"][Trace][cublasLt" in x and b"algo=[" in x and x.rstrip().endswith(b"0X0"))
    if kind == "raw":
        n = 0
        for x in complete:
            try:
                o = json.loads(x)
            except ValueError:
                continue
            n += isinstance(o, dict) and "backend" in o
        return n
    if kind in ("lines", "table"):
        return len(complete) + (lines[-1] != b"")
    raise ValueError(spec)


def _produced(case: Case, r, out: Path) -> int:
    kind = case.count.rpartition(":")[0]
    if kind == "raw":
        return len(pd.read_parquet(out.with_suffix(".parquet")))
    if kind == "table":
        return len(r.stdout.splitlines()) - 1
    if "-f" in case.cmd and case.cmd[case.cmd.index("-f") + 1] == "csv":
        return len(pd.read_csv(__import__("io").StringIO(r.stdout), dtype=str, keep_default_na=False))
    return len(r.stdout.splitlines())


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input(name, files, tmp_path):
    case = CASES[name]
    out = tmp_path / "out"
    stdin = files[case.stdin].read_bytes() if case.stdin else None
    r = CliRunner().invoke(main, case.argv(files, out), input=stdin)
    text = r.output
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code in case.exits, f"exit {r.exit_code}, expected {case.exits}: {r.stderr[-1500:]}"
    if r.exit_code == 1:
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
        assert len(errors) == 1 and r.stderr.splitlines()[-1] == errors[0], r.stderr[-1500:]
        named = {Path(a).name for a in case.argv(files, out) if "/" in a}
        assert any(n and n in errors[0] for n in named), f"the error names no input: {errors[0]}"
        assert FIX_WORDS.search(errors[0].split(":", 1)[1]), f"the error says no fix: {errors[0]}"
        assert len(errors[0]) < 1200
    if r.exit_code == 2:
        assert "Error:" in r.stderr
    if case.count and r.exit_code in (0, 3):
        assert _produced(case, r, out) == _expected(case.count, files), name


# --- outputs: a pipe closed early, and the locale, in real processes --------------------------------------
PIPED = [
    ["parse-log", str(LOG), str(LOG), str(LOG), "-f", "jsonl"],
    ["parse-log", str(LOG), str(LOG), str(LOG)],
    ["parse-log", str(LOG), "-f", "csv"],
    ["decode", "-f", "jsonl", "-"],
    ["trace", str(TRACE), "-f", "csv", "--top", "0"],
    ["diff", str(DATA / "h200_llm.parquet"), str(DATA / "h200_llm.parquet"), "--backends", "torch,torch-lt",
     "-f", "jsonl", "--top", "0"],
    ["schema"],
    ["grammars"],
]


@pytest.mark.parametrize("argv", PIPED, ids=[" ".join(a[:2]) if len(a) > 1 else a[0] for a in PIPED])
def test_closed_pipe_is_quiet(argv, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("".join(json.loads(x)["kernel"] + "\n"
                             for x in (FIXTURES / "names" / "names.jsonl").read_text().splitlines()) * 20)
    cmd = " ".join(f"'{a}'" for a in [sys.executable, "-m", "cublaslt_probe", *argv])
    script = f"{cmd} < '{names}' | head -c 100 > /dev/null; echo \"rc=${{PIPESTATUS[0]}}\" >&2"
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.stderr.strip() == "rc=0", p.stderr[-2000:]


@pytest.mark.parametrize("locale", ["C", "C.UTF-8", "POSIX"])
def test_any_locale_writes_utf8(locale, tmp_path):
    env = dict(os.environ, LC_ALL=locale, LANG=locale)
    p = subprocess.run([sys.executable, "-m", "cublaslt_probe", "decode", "-f", "jsonl", "-"],
                       input=b"nvjet_\xff\xfe_x\n\xe6\x97\xa5\xe6\x9c\xac\n", capture_output=True, env=env,
                       cwd=ROOT, timeout=60)
    assert p.returncode == 3 and b"Traceback" not in p.stderr
    assert [json.loads(x)["name"] for x in p.stdout.decode("utf-8").splitlines()] == \
        ["nvjet_\ufffd\ufffd_x", "日本"]
