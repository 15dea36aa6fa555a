"""The raw record (`raw_record.RawRecord`) on the shipped captures (data/, tests/fixtures/probe, tests/fixtures/moe):
the probe's phases write the saved form the captures hold, key for key and in order; `from_dict` reads every
version; and the dataset's schema is checked against the record's fields."""
import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from cublaslt_probe.analysis import dataset
from cublaslt_probe.cases import Case
from cublaslt_probe.gpu.operands import Built
from cublaslt_probe.gpu.probe import _fill_config, _fill_heuristic, _fill_kernels, _fill_timing
from cublaslt_probe.gpu.timing import Timing
from cublaslt_probe.raw_record import LINE_KIND, REQUIRED, RawRecord

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
# Raw files written by the probe since every phase's fields have been saved (`to_dict`'s rule); probe_raw.jsonl
# is older (no timing evidence, no step times) and is read through the compatibility defaults.
CURRENT = [ROOT / "data" / f"h200_{n}.raw.jsonl.gz" for n in ("grid", "llm", "square", "regret")] + \
    [FIXTURES / "moe" / "moe_sweep.raw.jsonl.gz"] + \
    [FIXTURES / "probe" / f"{n}_raw.jsonl" for n in ("leaked_flags", "lead_spin", "long_spin")]
OLDER = FIXTURES / "probe" / "probe_raw.jsonl"


def _records(path: Path) -> list[dict]:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        return [d for d in map(json.loads, f) if d.get(LINE_KIND) != "env"]


def _saved(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != LINE_KIND}


@pytest.mark.parametrize("path", CURRENT, ids=lambda p: p.name)
def test_a_saved_record_reads_back_to_the_same_line(path):
    """`to_dict(from_dict(line))` is the line, key for key and in the order the probe wrote it."""
    recs = _records(path)
    assert recs
    for d in recs:
        back = RawRecord.from_dict(d).to_dict()
        assert list(back.items()) == list(_saved(d).items()), d["key"]


def _timing(d: dict) -> Timing:
    """The `Timing` whose fill gives record `d`'s timing fields (its samples: as many as it had, the fastest)."""
    tm = d["timing"]
    return Timing(d["time_us"], (d["time_us_min"],) * d["time_us_reps"], d["time_calls_per_rep"], d["time_us_first"],
                  d["time_gap_us"], tm["spin_us"], tm["enqueue_us"], tm["attempts"], tm["behind"], tm["retaken"],
                  tm["estimate_us"], tm["rule"], tm.get("gap_limit_us"), tm.get("sized_by", "estimating call"))


def _phases(d: dict) -> RawRecord:
    """Record `d` made again as `Probe.run_window` makes it: from its Case, then one fill per phase, in the
    order the probe runs them, with the values the capture measured."""
    rec = RawRecord.of_case(Case.from_key(d["key"]))
    steps = dict(d["probe_ms"])
    share = steps.pop("profile_share", None)
    heuristic_share = steps.pop("heuristic_share", None)
    rec.probe_ms = steps
    tm = d.get("timing") or {}
    built = Built(None, (), d["lt_config"], d["lt_waves"], replay=tm.get("launch") == "replay",
                  replay_refused=tm.get("replay_refused"))
    rec.log_lines = d["log_lines"]
    _fill_config(rec, built)
    if d.get("error"):
        rec.error = d["error"]
        return rec
    _fill_timing(rec, _timing(d), built)
    _fill_kernels(rec, list(zip(d["kernels"], d["kernel_us"])), share)
    if "heuristic_where" in d:
        _fill_heuristic(rec, d["heuristic_miss_us"], d["heuristic_hit_us"], d.get("heuristic_error"),
                        d["heuristic_shared"], d["heuristic_where"])
        rec.probe_ms["heuristic_share"] = heuristic_share
    return rec


def test_the_probes_phases_write_what_a_grouped_capture_holds():
    """MoE records of the current probe (grouped fields, timing evidence with `launch` and `replay_refused`,
    pipelined and not): made again phase by phase, each is its saved line exactly."""
    recs = _records(FIXTURES / "moe" / "moe_sweep.raw.jsonl.gz")
    assert any("replay_refused" in r["timing"] for r in recs) and any(r["probe_ms"].get("wait") for r in recs)
    for d in recs:
        assert list(_phases(d).to_dict().items()) == list(_saved(d).items()), d["key"]


def test_the_probes_phases_write_the_keys_of_a_dense_capture_in_order():
    """Dense records with the heuristic's phase (long_spin: measured where, shared by how many): made again
    phase by phase, every key is where the probe wrote it and every value but the timing evidence (this
    capture's evidence predates `sized_by` and `launch`) is the saved one."""
    recs = _records(FIXTURES / "probe" / "long_spin_raw.jsonl")
    assert all("heuristic_where" in d for d in recs)
    for d in recs:
        got = _phases(d).to_dict()
        assert list(got) == list(_saved(d)), d["key"]
        assert {k: v for k, v in got.items() if k != "timing"} == \
            {k: v for k, v in _saved(d).items() if k != "timing"}, d["key"]


def test_an_older_record_reads_with_the_defaults_in_one_place():
    """probe_raw.jsonl predates the first-call time and batches: the first call is the median, one call per
    sample where there are samples; a record without `batch` is one GEMM; the line's kind is dropped, a key of
    another version kept, an environment column stamped by the reader held as the record's environment."""
    recs = _records(OLDER)
    assert not any("time_us_first" in d or "time_calls_per_rep" in d for d in recs)
    for d in recs:
        r = RawRecord.from_dict(d)
        assert r.time_us_first == d["time_us"]
        assert r.time_calls_per_rep == (1 if d["time_us_reps"] else None)
    d = {k: v for k, v in recs[0].items() if k != "batch"}
    r = RawRecord.from_dict({LINE_KIND: "gemm", **d, "gpu": "NVIDIA H200", "cc": "9.0", "retired_field": 3})
    assert r.batch == 1 and r.env == {"gpu": "NVIDIA H200", "cc": "9.0"} and r.extra == {"retired_field": 3}
    assert LINE_KIND not in r.to_dict() and r.to_dict()["retired_field"] == 3


def test_the_required_fields_are_those_without_a_default():
    """What the reader demands of a line (`REQUIRED`, checked before `from_dict`) is what a RawRecord cannot be
    made without."""
    bare = {f.name for f in dataclasses.fields(RawRecord)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert set(REQUIRED) == bare


class _Watched(RawRecord):
    """A RawRecord that notes which of its fields are read."""
    read: set = set()

    def __getattribute__(self, name):
        if not name.startswith("_"):
            _Watched.read.add(name)
        return object.__getattribute__(self, name)


def test_the_dataset_reads_every_field_it_does_not_leave_out(monkeypatch):
    """`build_rows` reads each field of the raw record but those `dataset.RAW_NOT_READ` names: a field added
    to RawRecord is either read into the dataset or left out by name."""
    fields = {f.name for f in dataclasses.fields(RawRecord)}
    assert set(dataset.RAW_NOT_READ) <= fields
    monkeypatch.setattr(dataset, "RawRecord", _Watched)
    _Watched.read = set()
    recs = _records(OLDER)[:50] + _records(ROOT / "data" / "h200_regret.raw.jsonl.gz")[:5]
    rows = list(dataset.build_rows(recs, {}))
    assert len(rows) == len(recs)
    assert (_Watched.read & fields) == fields - set(dataset.RAW_NOT_READ)


def test_a_column_named_after_a_field_holds_that_field():
    """Every dataset column that shares a raw field's name holds that field's value, on every record of the
    shipped captures, and follows it when it changes."""
    same = [c for c in dataset.COLUMNS if c in {f.name for f in dataclasses.fields(RawRecord)}
            and c != "candidates"]   # the candidates' JSON (`candidates.to_json`)
    assert {"key", "m", "time_us", "heuristic_miss_us", "lt_waves", "error", "time_us_first"} <= set(same)
    recs = _records(OLDER) + _records(ROOT / "data" / "h200_regret.raw.jsonl.gz")
    for d, row in zip(recs, dataset.build_rows(recs, {})):
        r = RawRecord.from_dict(d)
        assert {c: row[c] for c in same} == {c: getattr(r, c) for c in same}, d["key"]
    d = next(x for x in recs if x.get("heuristic_shared") and not x["error"])
    for c in same:
        if c in ("key", "backend", "op", "dtype", "layout", "kernels", "error"):
            continue   # the identity and the evidence the row is decoded from
        moved = {**d, c: 7}
        [row] = dataset.build_rows([moved], {})
        assert row[c] == 7, c
