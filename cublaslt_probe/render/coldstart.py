"""A cold-start breakdown as text (`cold-start`'s text output): the run table, the causes with their share of the
excess (and their spread over the rounds), the evidence, the caches, the kernels seen made at run time, the
what-ifs and the verdict, from `analysis.coldstart.breakdown.analyse`'s result."""
from __future__ import annotations

from cublaslt_probe.analysis.coldstart.routes import MECH_LABEL
from cublaslt_probe.analysis.coldstart.runs import fmt_ms


def _share(sec: float, ex: float) -> str:
    """A cause's share of the excess; beyond 100 % (a cause measured in other runs larger than the excess: the runs
    disagree, `analyse_round` says so) it is shown as such, not as a number of thousands of percent."""
    if ex <= 0:
        return "    n/a"
    return "  >100%" if sec > ex else f"{100 * sec / ex:6.1f}%"


def _range(sp: dict | None) -> str:
    """A figure's spread over the rounds, in ms ("" without rounds)."""
    return f"{sp['min'] * 1e3:.1f}–{sp['max'] * 1e3:.1f}" if sp else ""


def _unexplained_line(a: dict, rounds: bool = False) -> str:
    """The table's last line: what no cause explains, or, where the measured causes add up to more than the
    excess (each is measured in its own runs, and the runs vary), by how much they over-explain it; with rounds,
    the noise it is compared with (`combine_rounds`)."""
    u, pct = a["unexplained_s"], a.get("unexplained_pct")
    label = "unexplained" if u >= 0 else "causes beyond the excess (noise between the runs)"
    share = ("  >100%" if abs(pct) > 100 else f"{abs(pct):6.1f}%") if pct is not None else "    n/a"
    if not rounds:
        return f"  {label:<72} {abs(u) * 1e3:10.1f} {share}"
    noise = (f"within noise (the excess and the rounds' unexplained vary by {a['noise_s'] * 1e3:.1f} ms)"
             if a.get("unexplained_within_noise") else f"beyond the noise ({a['noise_s'] * 1e3:.1f} ms)")
    return f"  {label:<72} {abs(u) * 1e3:10.1f} {'':>15} {share}  {noise}"


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
    lines.append(f"  {'run':<14} {'environment':<48} {'step 1':>11} {'step 2':>10} {'steady':>10} {'run wall':>9}"
                 + (f" {'step 1 spread ms':>17} {'runs':>4} round" if rounds else ""))
    for t in a["table"]:
        lines.append(f"  {t['run']:<14} {t['env'][:48]:<48} {fmt_ms(t['step1_s']):>11} {fmt_ms(t['step2_s']):>10} "
                     f"{fmt_ms(t['steady_s']):>10} {t['wall_s'] or 0:8.1f}s"
                     + (f" {_range((t.get('spread') or {}).get('step1_s')):>17} {t.get('rounds', 1):>4} "
                        f"{t.get('round', 1):>5}" if rounds else "") + ("" if t["ok"] else "  FAILED"))
        if t.get("error"):
            lines.append(f"      {' '.join(t['error'].split())[-160:]}")
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
    lines.append(f"  {'cause':<72} {'ms':>10} " + (f"{'spread ms':>15} " if rounds else "") + f"{'share':>7}  how")
    for c in sorted(a["components"], key=lambda c: -c["seconds"]):
        share = _share(c["seconds"], ex)
        mid = f"{_range(c.get('spread')):>15} " if rounds else ""
        flag = "within noise; " if c.get("within_noise") else ""
        lines.append(f"  {c['label']:<72} {c['seconds'] * 1e3:10.1f} {mid}{share}  {flag}{c['how']}")
    lines.append(_unexplained_line(a, rounds))
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
