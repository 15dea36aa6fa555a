"""A cold-start breakdown as text (`cold-start`'s text output): the run table, the causes with their share of the
excess (and their spread over the rounds), the evidence, the caches, the kernels seen made at run time, the
what-ifs and the verdict, from `analysis.coldstart.breakdown.analyse`'s result."""
from __future__ import annotations

from cublaslt_probe.analysis.coldstart.routes import MECH_LABEL
from cublaslt_probe.analysis.coldstart.runs import fmt_ms
from cublaslt_probe.render.text import Table


def _share(sec: float, ex: float) -> str:
    """A cause's share of the excess; beyond 100 % (a cause measured in other runs larger than the excess: the runs
    disagree, `analyse_round` says so) it is shown as such, not as a number of thousands of percent."""
    if ex <= 0:
        return "n/a"
    return ">100%" if sec > ex else f"{100 * sec / ex:.1f}%"


def _range(sp: dict | None) -> str:
    """A figure's spread over the rounds, in ms ("" without rounds)."""
    return f"{sp['min'] * 1e3:.1f}–{sp['max'] * 1e3:.1f}" if sp else ""


def _unexplained_row(a: dict, rounds: bool = False) -> list[str]:
    """The causes table's last row: what no cause explains, or, where the measured causes add up to more than the
    excess (each is measured in its own runs, and the runs vary), by how much they over-explain it; with rounds,
    the noise it is compared with (`combine_rounds`)."""
    u, pct = a["unexplained_s"], a.get("unexplained_pct")
    label = "unexplained" if u >= 0 else "causes beyond the excess (noise between the runs)"
    share = (">100%" if abs(pct) > 100 else f"{abs(pct):.1f}%") if pct is not None else "n/a"
    if not rounds:
        return [label, f"{abs(u) * 1e3:.1f}", share, ""]
    noise = (f"within noise (the excess and the rounds' unexplained vary by {a['noise_s'] * 1e3:.1f} ms)"
             if a.get("unexplained_within_noise") else f"beyond the noise ({a['noise_s'] * 1e3:.1f} ms)")
    return [label, f"{abs(u) * 1e3:.1f}", "", share, noise]


# The two tables, drawn by the one table renderer (`render.text.Table`) and so fitted to the terminal's width: the
# prose columns break onto more lines, the figures are never cut, and where that is not enough the last columns
# are left out (the closing line names them; the page written with -o FILE.txt has them all). A failed run is
# marked FAILED on the line under its row, with its error: a column the width leaves out cannot take it along.
_RUNS = ["run", "environment", "step 1", "step 2", "steady", "run wall"]
_RUNS_ROUNDS = ["step 1 spread ms", "runs", "round"]
_CAUSES = ["cause", "ms", "share", "how"]
_CAUSES_ROUNDS = ["cause", "ms", "spread ms", "share", "how"]
_FIGURES = {"step 1", "step 2", "steady", "run wall", "step 1 spread ms", "runs", "round", "ms", "spread ms",
            "share"}
_PROSE = {"environment", "cause", "how"}
_CELL = 400   # a prose cell is written whole where the width allows (`Table`'s cap)


def _table(header: list[str]) -> Table:
    """A table of the page: indented under its heading, figures right-aligned, prose broken rather than cut."""
    return Table(header, _FIGURES, indent="  ", max_width=_CELL, wrap=_PROSE, whole="-o FILE.txt")


def _runs_lines(a: dict, rounds: bool) -> list[str]:
    """The run table, each failed run marked FAILED, with its error, on a line under its row."""
    header = _RUNS + (_RUNS_ROUNDS if rounds else [])
    rows = []
    for t in a["table"]:
        rows.append([t["run"], t["env"], fmt_ms(t["step1_s"]), fmt_ms(t["step2_s"]), fmt_ms(t["steady_s"]),
                     f"{t['wall_s'] or 0:.1f}s"]
                    + ([_range((t.get("spread") or {}).get("step1_s")), str(t.get("rounds", 1)),
                        str(t.get("round", 1))] if rounds else []))
    table = _table(header)
    table.layout(rows)
    out = [table.head()]
    for t, r in zip(a["table"], rows):
        out.append(table.row(r))
        err = " ".join((t.get("error") or "").split())[-160:]
        said = ([] if t["ok"] else ["FAILED" + (":" if err else "")]) + ([err] if err else [])
        if said:
            out.append(f"      {' '.join(said)}\n")
    out.append(table.left_out())
    return "".join(out).rstrip("\n").split("\n")


def _causes_lines(a: dict, rounds: bool) -> list[str]:
    """The causes table, largest first, then the unexplained row."""
    ex = a["excess_s"]
    rows = []
    for c in sorted(a["components"], key=lambda c: -c["seconds"]):
        rows.append([c["label"], f"{c['seconds'] * 1e3:.1f}"] + ([_range(c.get("spread"))] if rounds else [])
                    + [_share(c["seconds"], ex), ("within noise; " if c.get("within_noise") else "") + c["how"]])
    rows.append(_unexplained_row(a, rounds))
    return _table(_CAUSES_ROUNDS if rounds else _CAUSES).text(rows).rstrip("\n").split("\n")


def render(a: dict) -> str:
    dev = a.get("device") or {}
    rounds = (a.get("rounds") or {}).get("n", 1) >= 2
    per = (f", {a['rounds']['n']} rounds: each run the median of its environment's runs by step 1, each figure's "
           "spread min–max over the rounds" if rounds else "")
    lines = [f"cold start of {a.get('label')} on {dev.get('gpu', '?')} (torch {dev.get('torch', '?')}, CUDA "
             f"{dev.get('cuda', '?')}), {a.get('steps')} steps per run{per}"]
    b = a.get("binding") or {}
    if b.get("sha256"):
        lines.append(f"program {b.get('file')} (sha256 {str(b['sha256'])[:12]}…); "
                     + ", ".join(f"{k} {v}" for k, v in (b.get("versions") or {}).items()))
    lines += [f"note: {n}" for n in a.get("notes") or []] + [""]
    lines += _runs_lines(a, rounds)
    lines.append("")
    if a.get("baseline") is None:
        lines.append(a.get("verdict", ""))
        return "\n".join(lines)
    ex = a["excess_s"]
    fig = (a.get("rounds") or {}).get("figures") or {}
    lines.append(f"step 1 of the {a['baseline']} run: {fmt_ms(a['step1_s'])} = steady {fmt_ms(a['steady_s'])} + excess "
                 f"{fmt_ms(ex)} (step 2: {fmt_ms(a['step2_s'])})"
                 + (f"; over the rounds step 1 {_range(fig['step1_s'])} ms, excess {_range(fig['excess_s'])} ms"
                    if rounds else ""))
    lines += _causes_lines(a, rounds)
    lines += ["", "evidence:"]
    for c in a["components"]:
        for e in c["evidence"]:
            lines.append(f"  - [{c['cause']}] {e}")
    for e in a.get("evidence", []):
        lines.append(f"  - {e}")
    comp = a["compilation"]
    for m, evs in comp["mechanisms"].items():
        for e in evs:
            lines.append(f"  - [{m}] {e}")
    for e in comp.get("hints", []):
        lines.append(f"  - [hint] {e}")
    if a.get("overhead_s") is not None:
        lines.append(f"  - the runs took {a['runs_wall_s']:.1f} s in all, of which {a['overhead_s']:.1f} s outside "
                     f"the program's own setup and steps ({a['import_s']:.1f} s importing torch, the rest process "
                     "start, CUPTI and evidence)")
    if a.get("caches"):
        lines += ["", "caches (files before the run → files the run wrote):"]
        for c in a["caches"]:
            lines.append(f"  - {c['run']}: {c['line']}")
    if a.get("kernels"):
        k = a["kernels"]
        lines += ["", f"kernels seen made at run time ({len(k)}):"]
        for name, v in sorted(k.items(), key=lambda kv: (kv[1]["provenance"], kv[0]))[:12]:
            lines.append(f"  - {name}: {v['provenance']} ({MECH_LABEL.get(v['mechanism'], v['mechanism'])}, "
                         f"evidence {v['evidence']}) — {v['how']}")
        if len(k) > 12:
            lines.append(f"  - … and {len(k) - 12} more (`--format json`: kernels)")
    if a.get("what_if"):
        lines += ["", "what-ifs:"] + [f"  - {w}" for w in a["what_if"]]
    lines += ["", f"verdict: {comp['verdict']}"]
    return "\n".join(lines)
