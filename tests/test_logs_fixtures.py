"""The parser against real logs captured on an H200 (tests/fixtures/logs, see PROVENANCE.md there).

`manifest.jsonl` lists, per log, the GEMMs the capturing script ran in launch order (torch view, cuBLAS
view and, for direct cuBLASLt calls, the algo config it asked for). Every matmul trace line of every log
must become a record that agrees with its manifest entry.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
from conftest import FIXTURES

from cublaslt_probe.logs import FIELD_NAMES, ParseStats, parse_cublas_log, parse_line, parse_log, short_dtype
from cublaslt_probe.logs.record import LEGACY_LETTERS

LOGS = FIXTURES / "logs"
LT_LOGS = ["level2_torch.log", "level2_torchlt.log", "level2_mixed.log", "level4_torch.log",
           "level5_torch.log", "mask31_torch.log"]
MATMUL_TRACE = re.compile(r"\]\[Trace\]\[cublasLt[A-Z]*Matmul\] ")

# manifest dtype → (A/B type, compute type); C/D follow A except for fp8 (bf16 out, as torch asks)
DTYPES = {"fp32": ("R_32F", "COMPUTE_32F"), "tf32": ("R_32F", "COMPUTE_32F_FAST_TF32"),
          "fp16": ("R_16F", "COMPUTE_32F"), "bf16": ("R_16BF", "COMPUTE_32F"),
          "fp8": ("R_8F_E4M3", "COMPUTE_32F")}
# lt_config keys → record fields
ALGO_KEYS = {"algo_id": "algo_id", "split_k": "num_splits_k", "custom_option": "custom_option",
             "cta_swizzling": "cta_swizzling", "tile": "tile", "stages": "algo_stages", "cluster": "cluster",
             "reduction_scheme": "reduction_scheme"}
# keys a trace record may carry in `extra` (pointers and strides): anything else means the parser
# missed a field
TRACE_EXTRA = re.compile(r"(A|B|C|D|workSpace|stream|computeDesc\.(biasPointer|aScalePointer|bScalePointer)"
                         r"|[ABCD]desc\.stridedBatchOffset|beta)")


def _manifest() -> dict[str, list[dict]]:
    out = defaultdict(list)
    with open(LOGS / "manifest.jsonl") as f:
        for line in f:
            entry = json.loads(line)
            out[entry["log"]].append(entry)
    for entries in out.values():
        entries.sort(key=lambda e: e["index"])
    return out


MANIFEST = _manifest()


def _ran(log: str) -> list[dict]:
    """The manifest's GEMMs of `log` that ran (a GEMM that raised has no trace line)."""
    return [e for e in MANIFEST[log] if e["error"] is None]


def test_fixtures_present_and_all_covered():
    assert (LOGS / "PROVENANCE.md").exists()
    for log in LT_LOGS + ["cublas_api.log"]:
        assert (LOGS / log).exists() and MANIFEST[log], log
    # a log added later must be added to the tests here too
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(LT_LOGS + ["cublas_api.log"])
    assert set(MANIFEST) == set(LT_LOGS + ["cublas_api.log"])


@pytest.mark.parametrize("log", LT_LOGS)
def test_every_line_parses(log):
    st = ParseStats()
    recs = list(parse_log(LOGS / log, api=True, stats=st))
    n_lines = sum(1 for _ in open(LOGS / log))
    assert (st.lines, st.records, st.bad, st.skipped) == (n_lines, n_lines, 0, 0), st.report()
    assert len({r.pid for r in recs}) == 1 and all(r.time for r in recs)


@pytest.mark.parametrize("log", LT_LOGS)
def test_every_trace_line_is_a_record(log):
    lines = [(i, x) for i, x in enumerate(open(LOGS / log), 1) if MATMUL_TRACE.search(x)]
    st = ParseStats()
    recs = list(parse_log(LOGS / log, stats=st))
    assert [r.line for r in recs] == [i for i, _ in lines]
    assert st.bad == 0
    for r in recs:
        assert r.kind == "trace" and r.file == str(LOGS / log)
        unknown = [k for k in r.extra if not TRACE_EXTRA.fullmatch(k)]
        assert not unknown, f"{log}:{r.line}: keys the parser does not know: {unknown}"


def _expected_function(e: dict) -> str | None:
    """cublasLtMatmul for cuBLASLt callers, a legacy name (checked by its letters) for cuBLAS callers.

    torch's addmm uses cuBLASLt with a bias epilogue, but falls back to cuBLAS for some shapes
    (measured here: 8x1024x1, k = 1): either is accepted for addmm.
    """
    if e["backend"] in ("torch-lt", "lt") or e["op"] == "scaled_mm":
        return "cublasLtMatmul"
    return None


def _trans_agree(r, e) -> bool:
    """Transposes agree, except where an operand has a dimension of 1: there N and T describe the same
    memory, and the caller (torch, cupy) picks either (measured: torch passes N for a 1-column B that the
    capturing script's layout calls T). m, n, k still match in that case."""
    a_free = 1 in (e["blas_m"], e["blas_k"])
    b_free = 1 in (e["blas_k"], e["blas_n"])
    return ((a_free or r.op_a == e["blas_trans_a"]) and (b_free or r.op_b == e["blas_trans_b"]))


@pytest.mark.parametrize("log", LT_LOGS)
def test_records_match_manifest(log):
    recs = list(parse_log(LOGS / log))
    ran = _ran(log)
    assert len(recs) == len(ran), f"{len(recs)} trace records for {len(ran)} GEMMs"
    for r, e in zip(recs, ran):
        where = f"{log}:{r.line} ({e['key']})"
        assert (r.m, r.n, r.k) == (e["blas_m"], e["blas_n"], e["blas_k"]), where
        assert _trans_agree(r, e), where
        assert (r.torch_m, r.torch_n, r.torch_k) == (e["m"], e["n"], e["k"]), where
        assert r.batch_count == (e["batch"] if e["batch"] > 1 else None), where
        ab, compute = DTYPES[e["dtype"]]
        assert (r.a_type, r.b_type, r.compute_type, r.scale_type) == (ab, ab, compute, "R_32F"), where
        cd = "R_16BF" if e["dtype"] == "fp8" else ab
        assert (r.c_type, r.d_type) == (cd, cd), where
        lt_addmm = e["op"] == "addmm" and r.function == "cublasLtMatmul"
        assert r.epilogue == ("EPILOGUE_BIAS" if lt_addmm else None), where
        want_fn = _expected_function(e)
        if want_fn is not None or lt_addmm:
            assert r.function == "cublasLtMatmul" and want_fn in (None, r.function), where
        else:  # the legacy name's letters: A/B type, compute/scale type, C/D type
            letters = re.fullmatch(r"cublasLt([A-Z]{3})Matmul", r.function)
            assert letters, where
            ab_l, cs_l, cd_l = letters.group(1)
            assert LEGACY_LETTERS[ab_l] == short_dtype(r.a_type), where
            assert LEGACY_LETTERS[cd_l] == short_dtype(r.d_type), where
            assert LEGACY_LETTERS[cs_l] == short_dtype(r.scale_type), where
            assert r.sm_count_target == 132, where  # the cuBLAS handle passes the SM count
        # the algo: always complete (defaults filled), and equal to what a direct cuBLASLt call asked for
        # numSplitsK=-1 is printed by some algos (algo 11 and 43 here): kept as printed
        assert r.algo_id is not None and (r.num_splits_k >= 1 or r.num_splits_k == -1), where
        assert r.custom_option >= 0, where
        assert all(getattr(r, f) is not None for f in ("tile", "algo_stages", "cluster", "reduction_scheme"))
        if e.get("lt_config"):
            got = {k: getattr(r, f) for k, f in ALGO_KEYS.items()}
            want = {k: e["lt_config"][k] for k in ALGO_KEYS}
            assert got == want, where
        assert r.workspace_bytes is not None and r.out_of_place is not None, where


@pytest.mark.parametrize("log", ["level5_torch.log", "mask31_torch.log"])
def test_level5_heuristic_queries_match_manifest(log):
    recs = list(parse_log(LOGS / log, api=True))
    queries = [r for r in recs if r.kind == "api" and r.function.endswith("AlgoGetHeuristic")]
    results = [r for r in recs if r.kind == "info" and r.function.endswith("AlgoGetHeuristic")]
    traces = [r for r in recs if r.kind == "trace"]
    ran = _ran(log)
    assert len(queries) == len(results) == len(traces) == len(ran)
    for q, res, t, e in zip(queries, results, traces, ran):
        where = f"{log}:{q.line} ({e['key']})"
        assert (q.m, q.n, q.k) == (e["blas_m"], e["blas_n"], e["blas_k"]), where
        assert _trans_agree(q, e), where
        assert (q.op_a, q.op_b) == (t.op_a, t.op_b), where
        assert q.function.replace("AlgoGetHeuristic", "") == t.function, where
        # the preference: the cuBLAS handle's 32 MiB workspace and SM count, torch's Lt path 1 MiB
        if t.function == "cublasLtMatmul":
            assert (q.workspace_bytes, q.sm_count_target) == (1048576, None), where
        else:
            assert (q.workspace_bytes, q.sm_count_target) == (33554432, 132), where
        assert "preference.maxWavesCount" in q.extra
        # the heuristic's answer names the algo the trace line then used
        assert res.extra["heuristicResults"].split()[0] == str(t.algo_id), where


def test_level4_info_lines():
    recs = list(parse_log(LOGS / "level4_torch.log", api=True))
    infos = [r for r in recs if r.kind == "info"]
    assert infos[0].function == "cublasLtCtxInit" and infos[0].extra == {}
    assert "shared memory" in infos[0].message
    assert all("heuristicResults" in r.extra for r in infos[1:])


def test_level5_and_mask31_agree():
    a = [r.to_dict() for r in parse_log(LOGS / "level5_torch.log", api=True)]
    b = [r.to_dict() for r in parse_log(LOGS / "mask31_torch.log", api=True)]
    for d in a + b:
        d.pop("file")
    assert [(d["kind"], d["function"], d["m"], d["algo_id"]) for d in a] == \
        [(d["kind"], d["function"], d["m"], d["algo_id"]) for d in b]


@pytest.mark.parametrize("log", LT_LOGS)
def test_stream_equals_line_by_line(log):
    """The caches of the streaming parser give the same records as parsing each line alone."""
    stream = list(parse_log(LOGS / log, api=True))
    alone = [parse_line(x, i, source=str(LOGS / log)) for i, x in enumerate(open(LOGS / log), 1)]
    assert [r.to_dict() for r in stream] == [r.to_dict() for r in alone if r is not None]


def test_cublas_api_log_gemms_match_manifest():
    st = ParseStats()
    calls = list(parse_cublas_log(LOGS / "cublas_api.log", stats=st))
    assert st.bad == 0 and st.records == len(calls) == sum(
        1 for x in open(LOGS / "cublas_api.log") if x.startswith("I! "))
    assert {c.version for c in calls} == {"13.1.0"}
    assert {c.pid for c in calls} == {600}
    gemms = [c for c in calls if "Gemm" in c.function]
    # torch's default path calls cuBLAS (cublasGemmEx); torch-lt and addmm go to cuBLASLt directly
    via_cublas = [e for e in _ran("cublas_api.log") if e["backend"] == "torch" and e["op"] == "mm"]
    assert len(gemms) == len(via_cublas) > 0
    for c, e in zip(gemms, via_cublas):
        assert c.function == "cublasGemmEx"
        assert (c.m, c.n, c.k) == (e["blas_m"], e["blas_n"], e["blas_k"])
        assert _trans_agree(c, e)
        ab, compute = DTYPES[e["dtype"]]
        assert (c.a_type, c.b_type, c.c_type, c.compute_type) == (ab, ab, ab, compute)
        assert c.value("lda") == 4096 and c.value("algo") == "CUBLAS_GEMM_DEFAULT_TENSOR_OP"
        assert c.info["MathMode"] == "CUBLAS_DEFAULT_MATH" and c.time.startswith("2026-")


@pytest.mark.parametrize("log,on_other_buffers", [("fp8_linear", False), ("gpt2_train", True),
                                                  ("llama_prefill", True)])
def test_without_pointers_makes_the_lines_of_one_gemm_on_any_buffers_alike(log, on_other_buffers):
    """A captured program's trace lines without their time stamps and pointers (upper- and lower-case hex, as in
    fp8's scale pointers) read alike exactly when the parser's records of them hold the same fields."""
    from cublaslt_probe.logs import without_pointers
    path = FIXTURES / "programs" / log / "cublaslt.log"
    text = path.read_text().splitlines()
    recs = [r for r in parse_log(str(path)) if r.kind == "trace"]
    assert recs
    fields = [f for f in FIELD_NAMES if f not in ("line", "time", "file", "message", "extra")]
    lines = without_pointers([text[r.line - 1] for r in recs])
    assert not any(re.search(r"0[xX][0-9a-fA-F]|\[\d{4}-", x) for x in lines), lines[:3]
    same = defaultdict(set)
    for r, x in zip(recs, lines):
        same[tuple(getattr(r, f) for f in fields)].add(x)
    assert all(len(v) == 1 for v in same.values()), [v for v in same.values() if len(v) > 1][:2]
    assert len(set(lines)) == len(same)
    # the logs with a GEMM run on two sets of buffers: fewer lines alike than distinct lines
    assert (len(set(lines)) < len({text[r.line - 1][21:] for r in recs})) == on_other_buffers
