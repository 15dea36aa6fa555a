"""Property suite over real traces changed the ways real files differ: `trace` and `audit` never crash, never
lose GEMM time without saying so, never print an absurd figure, and stay about as fast as on the original.

Every committed capture (tests/fixtures/programs/*/, tests/fixtures/traces/, tests/fixtures/coldstart/; see
PROVENANCE.md there) is changed by each mutation of tests/trace_mutations.py that applies to it (the kinds of
issue 36), and run through the CLI in-process for ``trace FILE`` and ``audit RUN_OR_FILE`` in the table, jsonl
and csv formats. For every run:

- no traceback and no "internal error";
- exit 0, 3 (partial) or 1, and 1 only when the input holds no kernel a reader could use, as one ``Error:``
  line (a file of several processes may also be refused that way, naming them);
- GEMM time is conserved: ``trace``'s rows and ``audit``'s per-step rows × steps equal the GEMM-kind kernels
  of the file summed here (`trace_mutations.gemm_truth`: the file's own events and the name decoder, nothing
  else of the package) within 0.1 %, or a note states the loss with its size;
- no ``nan``, ``inf``, negative time or share over 100 % in any format;
- CPU time within 2× that of the unmutated input (scaled by the events added) + 0.5 s (`_slower`);
- mutations that change nothing a reader needs (flow arrows, GPU-side annotations, repeated or B/E step
  ranges, ids >= 2^63, a BOM, ...) give the unmutated input's figures, and a second rank of the same program
  never lowers the GEMM time per step.

Each failing case lists every broken property, tagged ``[crash]``, ``[exit]``, ``[conservation]``,
``[absurd]``, ``[time]``, ``[invariant]``.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
import time

import pytest
import trace_mutations as TM
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as hs

from cublaslt_probe.cli import main

SRC = TM.sources()
# inputs every mutation runs on: run folders of a host-bound decode and of an MoE (grouped GEMMs), and a bare
# trace; then one more per mutation, in turn, of the other captures (compiled, attention-only, with_modules, ...)
CORE = ["llama_decode", "mixtral_moe", "traces/fp8_linear"]
TURNS = ["compiled_mlp", "llama_decode_with_modules", "sdpa_flash", "traces/transformer_bf16", "llama_prefill",
         "fp8_linear", "odd_linear", "cli_script", "compiled_mm_autotune", "sdpa_math", "sdpa_cudnn"]
# the largest capture (a training step, forward and backward) for the mutations about steps, ranks, links
BIG = "gpt2_train"
BIG_MUTATIONS = {"steps_duplicated", "merge_same_program", "drop_sequence_numbers"}


def _cases() -> list[tuple[str, str]]:
    out, turn = [], 0
    for m in TM.MUTATIONS:
        mut = TM.MUTATIONS[m]
        extra = []
        for _ in range(len(TURNS)):        # the next capture in turn that the mutation applies to
            cand = TURNS[turn % len(TURNS)]
            turn += 1
            if TM.applies(mut, SRC[cand]):
                extra = [cand]
                break
        out += [(m, s) for s in CORE + extra + ([BIG] if m in BIG_MUTATIONS else []) if TM.applies(mut, SRC[s])]
    return out


CASES = _cases()
REL = 1e-3                              # conservation tolerance: 0.1 %
NUM = r"-?\d[\d,]*(?:\.\d+)?"
# a figure that is not a number, or a negative one: as a table cell (two spaces or a line end around it), in
# parentheses, or followed by a unit; the words in prose ("a NaN duration", zlib's "Error -3") are not figures
BAD_FIGURE = re.compile(r"(?<![\w.\-–])(-?(?:nan|inf|infinity)|-\d[\d,]*(?:\.\d+)?)(?![\w.])", re.I)
FIGURE_AFTER = re.compile(r"\s?(?:(?:ms|µs|us|s|x)\b|%)|\s?\)|\s\s|\s*$")
PCT = re.compile(rf"({NUM})\s?%")
TIME_COLS = re.compile(r"(_us|_ms|^share$|^calls$|^count$|^launches$|^kernels$|^tflops$|^pct_peak$|^waves$|"
                       r"^floor_ratio$|^m$|^n$|^k$|^batch$|^groups$|^instances$)")
ERR_MERGE = re.compile(r"process|pid|rank", re.I)


def _run(args):
    t = time.process_time()
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r, time.process_time() - t


def _crash(r, label, problems):
    out = r.output + (r.stderr or "")
    if "Traceback" in out or "internal error" in out or (r.exception is not None
                                                        and not isinstance(r.exception, SystemExit)):
        problems.append(f"[crash] {label}: {(out.strip().splitlines() or [repr(r.exception)])[-1][:300]} "
                        f"{'' if r.exception is None else repr(r.exception)[:200]}")
        return True
    return False


def _exit(r, label, usable, problems, merged=False):
    if r.exit_code not in (0, 1, 3):
        problems.append(f"[exit] {label}: exit {r.exit_code}")
    if r.exit_code == 1:
        errs = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
        if len(errs) != 1 or r.stderr.strip().splitlines()[-1] != errs[0]:
            problems.append(f"[exit] {label}: exit 1 without one Error: line: {r.stderr[-300:]!r}")
        elif usable and not (merged and ERR_MERGE.search(errs[0])):
            problems.append(f"[exit] {label}: exit 1 on an input with usable kernels: {errs[0][:300]}")


def _absurd_text(text, label, problems):
    for ln in text.splitlines():
        body = ln.split("Error:", 1)[0]
        for m in BAD_FIGURE.finditer(body):
            before = body[max(0, m.start() - 2):m.start()]
            if FIGURE_AFTER.match(body, m.end()) or before.endswith(("(", "  ")) or m.start() == 0:
                problems.append(f"[absurd] {label}: {m.group(0)!r} in {ln.strip()[:200]!r}")
                return
        for p in PCT.findall(body):
            if float(p.replace(",", "")) > 100.05:
                problems.append(f"[absurd] {label}: {p} % in {ln.strip()[:200]!r}")
                return


def _absurd_value(col, v, label, problems) -> bool:
    if isinstance(v, str):
        try:
            v = float(v) if v.strip() else None
        except ValueError:
            return False
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    why = None
    if not math.isfinite(v):
        why = "not finite"
    elif v < 0 and TIME_COLS.search(col):
        why = "negative"
    elif col == "share" and v > 1.0005:
        why = "share over 100 %"
    if why:
        problems.append(f"[absurd] {label}: {col}={v} ({why})")
    return why is not None


def _jsonl(text, label, problems) -> list[dict]:
    rows = []
    for ln in text.splitlines():
        try:
            o = json.loads(ln, parse_constant=lambda c: float(c))
        except ValueError:
            problems.append(f"[absurd] {label}: a jsonl line is not JSON: {ln[:120]!r}")
            continue
        rows.append(o)
        for c, v in o.items():
            if _absurd_value(c, v, label, problems):
                break
    return rows


def _csv(text, label, problems):
    for row in csv.DictReader(io.StringIO(text)):
        for c, v in row.items():
            if c and _absurd_value(c, v, label, problems):
                return


def _loss_stated(texts, loss_us, truth_us, steps) -> bool:
    """A note or warning gives the lost GEMM time: µs or ms (in all or per step), or % of GEMM time."""
    want = {"µs": [loss_us, loss_us / steps], "us": [loss_us, loss_us / steps],
            "ms": [loss_us / 1e3, loss_us / steps / 1e3], "%": [100 * loss_us / truth_us if truth_us else 0]}
    for t in texts:
        for ln in t.splitlines():
            if not re.search(r"note|warning|left out|lost|missing|skipped", ln, re.I):
                continue
            for num, unit in re.findall(rf"({NUM})\s?(µs|us|ms|%)", ln):
                x = float(num.replace(",", ""))
                if any(abs(x - w) <= max(0.05 * abs(w), 0.051) for w in want[unit]):
                    return True
    return False


def _steps(text) -> int | None:
    m = re.search(r"^(\d[\d,]*) steps?; per step", text, re.M)
    return int(m.group(1).replace(",", "")) if m else None


def _conserved(label, got_us, truth_us, texts, steps, problems):
    if abs(got_us - truth_us) <= REL * max(truth_us, 1e-9) + 1e-6:
        return
    if not _loss_stated(texts, abs(truth_us - got_us), truth_us, steps):
        problems.append(f"[conservation] {label}: {got_us:,.1f} µs of GEMM time against {truth_us:,.1f} µs in the "
                        f"file ({100 * (got_us - truth_us) / truth_us if truth_us else float('inf'):+.1f} %), "
                        "no note gives the difference")


_BASE: dict = {}


def _slower(cmd, argv, t, base, size_ratio, problems):
    """CPU time `t` of the mutated run against 2x the unmutated one's (scaled by the events added) + 0.5 s.
    The first unmutated time taken serves while the mutated run is within it; over it, the unmutated run is
    timed again now, beside the mutated one, so that a busy machine does not pass for a slow mutation."""
    limit = lambda t0: 2 * t0 * size_ratio + 0.5
    if t <= limit(base[f"{cmd}_s"]):
        return
    _, t0 = _run(argv)
    if t > limit(t0):
        problems.append(f"[time] {cmd}: {t:.2f} s CPU against {t0:.2f} s unmutated")


def _baseline(src):
    """The unmutated input's trace and audit jsonl figures (sum of GEMM µs, steps)."""
    if src.name not in _BASE:
        ra, ta = _run(["audit", src.target, "-f", "jsonl"])
        rt, _ = _run(["audit", src.target])
        tr, tt = _run(["trace", src.trace, "-f", "jsonl", "--top", "0"])
        assert ra.exit_code == 0 and tr.exit_code == 0, (ra.stderr, tr.stderr)
        _BASE[src.name] = dict(audit_us=sum(json.loads(x)["gpu_us"] for x in ra.stdout.splitlines()),
                               rows=len(ra.stdout.splitlines()), steps=_steps(rt.stdout), audit_s=ta, trace_s=tt,
                               trace_us=sum(json.loads(x)["total_us"] for x in tr.stdout.splitlines()))
    return _BASE[src.name]


def check(m: TM.Mutation, src: TM.Source, b: TM.Built, csv_too: bool = True) -> list[str]:
    """Every property of the module doc on one mutated input; the list of what broke."""
    problems: list[str] = []
    truth_us, n_gemm, _ = TM.gemm_truth(b.events)
    merged = m.name.startswith("merge")
    base = _baseline(src)

    # ---- trace
    tj, t_trace = _run(["trace", b.trace, "-f", "jsonl", "--top", "0"])
    tt, _ = _run(["trace", b.trace, "--top", "0"])
    for r, lab in ((tj, "trace jsonl"), (tt, "trace table")):
        if not _crash(r, lab, problems):
            _exit(r, lab, b.usable, problems, merged)
            _absurd_text(r.stdout if "table" in lab else "", lab, problems)
            _absurd_text(r.stderr, lab + " stderr", problems)
    if tj.exit_code in (0, 3) and tj.exception is None:
        rows = _jsonl(tj.stdout, "trace jsonl", problems)
        _conserved("trace jsonl", sum(float(o.get("total_us") or 0) for o in rows), truth_us,
                   [tj.stderr, tt.stdout], 1, problems)
        if m.invariant and abs(sum(float(o.get("total_us") or 0) for o in rows) - base["trace_us"]) > \
                REL * base["trace_us"] + 1e-6:
            problems.append(f"[invariant] trace jsonl: GEMM µs {sum(o.get('total_us') or 0 for o in rows):,.1f} "
                            f"against {base['trace_us']:,.1f} unmutated")
    _slower("trace", ["trace", src.trace, "-f", "jsonl", "--top", "0"], t_trace, base, b.size_ratio, problems)

    # ---- audit
    aj, t_audit = _run(["audit", b.target, "-f", "jsonl"])
    at, _ = _run(["audit", b.target, "--top", "0"])
    runs = [(aj, "audit jsonl"), (at, "audit table")]
    ac = None
    if csv_too:
        ac, _ = _run(["audit", b.target, "-f", "csv"])
        runs.append((ac, "audit csv"))
    for r, lab in runs:
        if not _crash(r, lab, problems):
            _exit(r, lab, b.usable, problems, merged)
            _absurd_text(r.stdout if "table" in lab else "", lab, problems)
            _absurd_text(r.stderr, lab + " stderr", problems)
    if ac is not None and ac.exit_code in (0, 3) and ac.exception is None:
        _csv(ac.stdout, "audit csv", problems)
    if aj.exit_code in (0, 3) and aj.exception is None and at.exit_code in (0, 3) and at.exception is None:
        rows = _jsonl(aj.stdout, "audit jsonl", problems)
        steps = _steps(at.stdout)
        if steps is None or steps < 1:
            problems.append(f"[absurd] audit table: no step count in {at.stdout[:200]!r}")
        else:
            per_step = sum(float(o.get("gpu_us") or 0) for o in rows)
            _conserved("audit jsonl", per_step * steps, truth_us, [aj.stderr, at.stdout], steps, problems)
            head = re.search(rf"GEMMs ({NUM}) ms", at.stdout)
            if head and abs(float(head.group(1).replace(",", "")) * 1e3 - per_step) > 0.5 + REL * abs(per_step):
                problems.append(f"[conservation] audit table says GEMMs {head.group(1)} ms per step, its rows "
                                f"{per_step / 1e3:,.3f} ms")
            if m.invariant and (abs(per_step - base["audit_us"]) > REL * base["audit_us"] + 1e-6
                                or steps != base["steps"]):
                problems.append(f"[invariant] audit: {steps} steps, {per_step:,.1f} µs of GEMMs per step against "
                                f"{base['steps']} steps, {base['audit_us']:,.1f} µs unmutated")
            if m.name == "merge_same_program" and per_step < (1 - REL) * base["audit_us"]:
                problems.append(f"[invariant] audit: a second rank lowers the GEMM time per step: "
                                f"{per_step:,.1f} µs against {base['audit_us']:,.1f} µs for one")
    _slower("audit", ["audit", src.target, "-f", "jsonl"], t_audit, base, b.size_ratio, problems)
    return problems


@pytest.mark.parametrize("mutation,source", CASES, ids=[f"{m}-{s.replace('/', '.')}" for m, s in CASES])
def test_mutated_capture(mutation, source, tmp_path):
    m, src = TM.MUTATIONS[mutation], SRC[source]
    b = TM.build(m, src, tmp_path)
    problems = check(m, src, b, csv_too=CASES.index((mutation, source)) % 3 == 0)   # csv: every third case
    assert not problems, "\n".join(problems)


# --- damage anywhere in a gzip stream, and cut anywhere: hypothesis picks the offsets -----------------------
GZ_SOURCE = "fp8_linear"


@settings(max_examples=8, derandomize=True, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frac=hs.floats(0.0, 1.0), width=hs.integers(1, 64), cut=hs.booleans())
@example(frac=0.005, width=8, cut=False)     # inside the first block, where the sniffer reads
@example(frac=0.999, width=4, cut=False)     # the trailer (CRC, size): every event is there
def test_gzip_damaged_anywhere(frac, width, cut, tmp_path_factory):
    src = SRC[GZ_SOURCE]

    def damage(data: bytes) -> bytes:
        import gzip
        gz = bytearray(gzip.compress(data, 6, mtime=0))
        at = min(int(frac * len(gz)), len(gz) - 1)
        if cut:
            return bytes(gz[:at])
        for i in range(at, min(at + width, len(gz))):
            gz[i] ^= 0xA5
        return bytes(gz)

    m = TM.Mutation(f"gzip@{frac:.3f}", "bytes", damage, gz=True)
    b = TM.build(m, src, tmp_path_factory.mktemp("gz"))
    problems = check(m, src, b)
    assert not problems, f"{'cut' if cut else f'{width} bytes damaged'} at {frac:.3f} of the gzip stream:\n" + \
        "\n".join(problems)


# --- a damaged or odd cold-start file given to --coldstart ---------------------------------------------------
COLD = TM.FIXTURES / "coldstart" / "compiled_mlp.json.gz"
COLD_RUN = SRC["compiled_mlp"]


@pytest.mark.parametrize("mutation", list(TM.COLDSTART_MUTATIONS))
def test_mutated_coldstart_file(mutation, tmp_path):
    cold = tmp_path / "coldstart.json.gz"
    cold.write_bytes(TM.COLDSTART_MUTATIONS[mutation](TM.raw_json(COLD)))
    problems: list[str] = []
    for args, lab in (((["audit", COLD_RUN.target, "-f", "jsonl"]), "audit jsonl"),
                      ((["audit", COLD_RUN.target]), "audit table"),
                      ((["trace", COLD_RUN.trace, "-f", "jsonl"]), "trace jsonl")):
        r, _ = _run(args + ["--coldstart", cold])
        if _crash(r, lab, problems):
            continue
        _exit(r, lab, False, problems)
        if r.exit_code == 1 and cold.name not in r.stderr:
            problems.append(f"[exit] {lab}: the error does not name the cold-start file: {r.stderr[-300:]!r}")
        _absurd_text(r.stdout if "table" in lab else "", lab, problems)
        if "jsonl" in lab and r.exit_code in (0, 3):
            _jsonl(r.stdout, lab, problems)
    assert not problems, "\n".join(problems)
