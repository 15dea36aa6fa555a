"""The audit drawn for a person: summary and stall lines, the GEMM table, advice and grouped-variant lines, the
chain of evidence per GEMM, matplotlib figures and the self-contained HTML page. CPU only.

Formats only: the measurement arrives typed and checked (`analysis.audit.measurement.Measurement`, with each
GEMM's label, each candidate's algo text and each kernel's decoded label and short form), the advice as items,
the rows a measured GEMM stands for from `analysis.audit.measured.measured_rows`.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from cublaslt_probe.analysis.audit.advice import advice_total, disproven, estimates, ranked
from cublaslt_probe.analysis.audit.measured import measured_rows
from cublaslt_probe.analysis.audit.measurement import GemmMeasurement, Measurement
from cublaslt_probe.analysis.audit.schema import Audit, _na, row_label
from cublaslt_probe.analysis.proof import kernel_phrase
from cublaslt_probe.vocab import FIGURE_FORMATS, figure

# --------------------------------------------------------------------------- rendering
TABLE_COLUMNS = ("share", "calls", "gpu_us", "module", "pass", "op", "dtype", "layout", "m", "n", "k", "groups",
                 "family", "provenance", "kernel_short", "algo", "pct_peak", "floor_ratio", "waves", "flags")


def html_cell(col: str, v) -> str:
    """A measurement's value as a table cell: figures rounded as everywhere else (`vocab.figure`; times
    in µs to 0.1), yes/no for booleans, nothing for a missing value (a kernel arrives as its label)."""
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return figure(col, v) if col in FIGURE_FORMATS else f"{v:,.1f}" if col.endswith("_us") else f"{v:.3g}"
    return str(v)


def flags(r: dict) -> str:
    """align-fallback, split-K, kernel≠log: what a row's booleans say, for the table."""
    out = []
    if not _na(r["align_fallback"]) and r["align_fallback"]:
        out.append("align-fallback")
    if not _na(r["split_k"]) and r["split_k"]:
        out.append("split-K")
    if not _na(r["log_consistent"]) and not r["log_consistent"]:
        out.append("kernel≠log")
    if not _na(r.get("sizes_source")) and r["sizes_source"] == "assumed":
        out.append("sizes-assumed")
    if not _na(r.get("graph")):
        out.append("graph")
    return " ".join(out)


def summary_lines(a: Audit) -> list[str]:
    """The audit's header, one fact a line; first the warning that the steps leave out most GEMM time."""
    from cublaslt_probe.analysis.trace import timeline_sentence
    cap = (a.env.get("capture") or {})
    lines = ([f"warning: {a.warning}"] if a.warning else []) + [
             f"{a.sources.get('trace')}" + (f" + {a.sources['log']}" if a.sources.get("log") else "")
             + (f"; GPU {a.gpu}" if a.gpu else "") + (f" ({a.env.get('sm_count')} SMs)" if a.env.get("sm_count")
                                                      else ""),
             f"{a.steps} step{'s' if a.steps != 1 else ''}; per step: GPU time {a.step_gpu_us / 1e3:,.3f} ms, GEMMs "
             f"{a.gemm_gpu_us / 1e3:,.3f} ms ({100 * a.gemm_gpu_us / a.step_gpu_us if a.step_gpu_us else 0:.1f} %) "
             f"in {len(a.rows):,} distinct GEMMs",
             f"GPU time: {timeline_sentence(a.timeline)}"]
    if len(a.rows):
        lines.append(f"attribution: {a.attribution}; {100 * a.attributed_share:.1f} % of GEMM time has a module"
                     + (f"; torch allow_tf32={cap.get('allow_tf32')}" if "allow_tf32" in cap else ""))
    if a.observed is not None:
        o = a.observed
        kinds = ", ".join(f"{k} {v}" for k, v in sorted((o.get("by_provenance") or {}).items()))
        lines.append(f"cold-start evidence ({o['source']}): {o['kernels']} kernel name(s) of this trace observed made "
                     f"or chosen at run time ({kinds + '; ' if kinds else ''}by mechanism: "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(o['by_mechanism'].items())) or 'none'}), "
                     f"{o['gpu_us']:,.1f} µs/step of GPU time; {o['gemm_rows']} GEMM row(s) upgraded to evidence "
                     "observed")
    lines += [f"note: {n}" for n in a.notes]
    lines += stall_lines(a)
    return lines


def stall_lines(a: Audit) -> list[str]:
    """One line per host stall (`stalls`): what held the host, and what the trace supports about why."""
    from cublaslt_probe.analysis.stalls import cause
    if a.stalls is None or not len(a.stalls):
        return []
    out = []
    for r in a.stalls.to_dict("records"):
        c = cause(r)
        out.append(f"host stall: {r['host_us'] / 1e3:,.1f} ms/step in {r['op']}"
                   + (f" ({r['module']})" if not _na(r.get("module")) else "")
                   + f" for {r['gpu_us']:,.1f} µs of its kernels"
                   f" — {c['cause']}; change: {c['change']}")
    return out


def table_rows(rows: pd.DataFrame) -> list[list[str]]:
    """The people's table of the rows: `TABLE_COLUMNS` as text."""
    def f(v, fmt):
        return "" if v is None or (not isinstance(v, str) and pd.isna(v)) else format(v, fmt)
    out = []
    for r in rows.to_dict("records"):
        out.append([f"{100 * r['share']:.1f}%" if r["share"] is not None and not pd.isna(r["share"]) else "",
                    figure("calls", r["calls"]), figure("gpu_us", r["gpu_us"]), row_label(r), f(r["pass"], ""),
                    f(r["op"], ""),
                    f(r["dtype"], ""), f(r["layout"], ""), f(r["m"], "d"), f(r["n"], "d"), f(r["k"], "d"),
                    f(r["groups"], "d"), f(r["family"], ""), f(r["provenance"], ""), f(r["kernel_short"], ""),
                    f(r["algo"], ""), figure("pct_peak", r["pct_peak"]), figure("floor_ratio", r["floor_ratio"]),
                    figure("waves", r["waves"]),
                    flags(r)])
    return out


def advice_entries(items: list[dict]) -> tuple[list[tuple[int, str, str, str]], str | None, list[str]]:
    """The advice as people read it, for the text and the page alike: (number, headline, evidence, risk) per
    item with a saving — the headline says which items it excludes ("alternative to item 1", "excludes item
    2") —, the line adding up the items that exclude no other (`advice_total`; None under two), and the
    quiet lines."""
    shown = ranked(items)
    out = []
    for n, it in enumerate(shown, 1):
        ex = it.get("excludes") or []
        rel = "; ".join(x for x in (_numbers("alternative to", [e for e in ex if e < n]),
                                    _numbers("excludes", [e for e in ex if e > n])) if x)
        out.append((n, f"{it['what']}: {_saves(it)}" + (f" — {rel}" if rel else ""), it["evidence"], it["risk"]))
    take, us, pct = advice_total(items)
    total = None
    if len(take) > 1:
        total = (f"items {', '.join(map(str, take[:-1]))} and {take[-1]} exclude no other: together they save "
                 f"{us:,.1f} µs/step" + (f" ({pct:.1f} % of the step)" if pct is not None else ""))
    return out, total, [it["what"] for it in items if it["saving_us"] <= 0]


def _unsettled(r: dict) -> str:
    """Where a proven saving is not pinned down (`analysis.proof.settled`): how far its rounds' quartiles
    spread, as shares of the prediction; else nothing."""
    sp = r.get("ratio_spread")
    if r.get("settled", True) or not sp:
        return ""
    return (f"; not pinned down after {r.get('rounds')} rounds: its rounds' quartiles are "
            f"{100 * sp[0]:.0f}–{100 * sp[1]:.0f} % of the prediction")


def proof_words(it: dict) -> str | None:
    """What the item's proof says (`analysis.proof.apply`), or None where no proof was given: proven µs/step
    with its spread and its share of the prediction, or why it is unproven (an *unproven estimate*)."""
    r = it.get("proof")
    if r is None:
        return None
    if r.get("status") == "proven":
        ratio, cost = r.get("ratio"), r.get("applier_cost_us")
        less = f" less the applier's own copies, {cost:,.1f} µs/step measured" if cost else ""
        return (f"proven {r['proven_us']:,.1f} µs/step [{r['spread_us'][0]:,.1f}, {r['spread_us'][1]:,.1f}] in the "
                f"program's step over {r.get('rounds')} rounds, noise ±{r.get('noise_us') or 0:,.1f}"
                + (f" ({100 * ratio:.0f} % of the prediction{less})" if ratio is not None else "")
                + _unsettled(r) + kernel_words(r) + (f"; {r['what_if']}" if r.get("what_if") else ""))
    return f"unproven estimate: {r.get('why') or r.get('status')}"


def kernel_words(r: dict) -> str:
    """What the step's own kernels say (`analysis.proof.in_step_reading`): their saving per step with the change
    on, and, where the proven saving departs from the prediction, whether the kernels ran at another speed in
    the step than alone or the rest of the step took the difference; '' without them."""
    k = r.get("kernel_saving_us")
    if k is None:
        return ""
    said = f"; {kernel_phrase(k)}"
    reading = r.get("in_step")
    share = f"{100 * r['proven_us'] / k:.0f} %" if k > 0 else None
    if reading == "kernels":
        return (f"{said} and the step {share} of that: the prediction timed its GEMMs alone, and in the step they "
                f"ran at another speed (corrected by their time in the step, the prediction holds)")
    if reading == "rest" and r.get("kernel_ratio") is not None:
        return (f"{said}, {100 * r['kernel_ratio']:.0f} % of the prediction, the step "
                + (f"{share} of that" if share else "not") + ": the rest of the step (GPU idle gaps, host time, "
                "launches) took the difference")
    return said


def _saves(it: dict) -> str:
    """``saves 4,953.5 µs/step (54.1 % of the step)``, predicted, then what its proof says."""
    head = (f"saves {it['saving_us']:,.1f} µs/step"
            + (f" ({it['saving_pct']:.1f} % of the step)" if it.get("saving_pct") is not None else ""))
    said = proof_words(it)
    return f"predicted: {head}; {said}" if said else head


def disproven_entries(items: list[dict]) -> list[tuple[str, str]]:
    """The items a proof found slower or within noise: (headline with the prediction, what the proof
    measured) each."""
    return [(f"{it['what']}: predicted to save {it['saving_us']:,.1f} µs/step", it["disproven"])
            for it in disproven(items)]


DISPROVEN_TITLE = "proven not to pay in the program's step (not ranked)"
ESTIMATES_TITLE = "estimates (not ranked: the GEMMs' saving alone, for a change that restructures the layer)"


def estimate_entries(items: list[dict]) -> list[tuple[str, str, str]]:
    """The estimates (`advice.estimates`), for the text and the page alike: (headline with the GEMM saving,
    what would have to be measured to rank it, evidence) each."""
    out = []
    for it in estimates(items):
        out.append((f"{it['what']}: its GEMMs alone save {it['saving_us']:,.1f} µs/step"
                    + (f" ({it['saving_pct']:.1f} % of the step)" if it.get("saving_pct") is not None else ""),
                    f"to rank it, measure {it['estimate']}", f"{it['evidence']}; risk: {it['risk']}"))
    return out


def _numbers(verb: str, ns: list[int]) -> str:
    """``excludes item 2`` / ``excludes items 2 and 3`` ('' for none)."""
    if not ns:
        return ""
    return f"{verb} item {ns[0]}" if len(ns) == 1 else (f"{verb} items {', '.join(map(str, ns[:-1]))} and "
                                                         f"{ns[-1]}")


def advice_lines(items: list[dict]) -> list[str]:
    """The advice as text lines (`advice_entries`)."""
    entries, total, quiet = advice_entries(items)
    out = []
    for n, head, ev, risk in entries:
        out += [f"{n}. {head}", f"   evidence: {ev}", f"   risk: {risk}"]
    if total:
        out.append(total)
    est = estimate_entries(items)
    if est:
        out.append(f"{ESTIMATES_TITLE}:")
        for head, need, ev in est:
            out += [f"* {head}", f"   {need}", f"   evidence: {ev}"]
    dis = disproven_entries(items)
    if dis:
        out.append(f"{DISPROVEN_TITLE}:")
        for head, said in dis:
            out += [f"* {head}", f"   {said}"]
    return out + [f"- {q}" for q in quiet]


HEADS = {"algo_text": "algo", "kernel_label": "kernel"}    # a measurement's field -> its column on the page
GROUPED_TABLE = ("variant", "rows", "µs", "vs original", "numerics", "kernel")


def grouped_tables(measure: Measurement | None) -> list[tuple[str, list[list[str]], list[str]]]:
    """For each measured grouped GEMM: a title (the GEMM, its module and sizes, recorded or assumed), one row
    per variant (`GROUPED_TABLE`: rows computed, µs, change against the original, max rel. error against it,
    the main kernel; transformers' experts implementations named beside the variant that runs as they do),
    and a line for each variant not run, saying why."""
    out = []
    for g in measure.gemms if measure is not None else []:
        vs = g.grouped
        if not vs:
            continue
        s = g.group_summary or {}
        impl = {v: k for k, v in g.implementations.items()}
        title = (f"{g.label}" + (f" ({g.module}" + (f" {g.pass_}" if g.pass_ else "") + ")" if g.module else "")
                 + f": {s.get('groups')} groups of {s.get('min')}–{s.get('max')} rows (mean {s.get('mean')}, "
                 f"{s.get('unaligned')} not a multiple of 8, max/mean {s.get('imbalance')}), sizes "
                 f"{g.sizes_source or 'recorded'}")
        base = vs[0].time_us
        body = []
        for v in vs:
            t = v.time_us
            num = g.numerics.get(v.variant)
            name = v.variant + (f" (experts_implementation {impl[v.variant]})" if v.variant in impl else "")
            body.append([name, f"{v.rows:,}" if v.rows is not None else "",
                         f"{t:,.1f}" if t else "not run",
                         f"{100 * (t - base) / base:+.1f} %" if t and base and v.variant != "original" else "",
                         "" if num is None else f"{num:.2g}", v.main_short])
        notes = [f"{v.variant} not run: {v.not_run or v.error}" for v in vs
                 if not v.time_us and (v.not_run or v.error)]
        out.append((title, body, notes))
    return out


def grouped_lines(measure: Measurement | None) -> list[str]:
    """`grouped_tables` as text."""
    from cublaslt_probe.render.text import render_table
    out = []
    for title, body, notes in grouped_tables(measure):
        out += [title, render_table(list(GROUPED_TABLE), body, {"rows", "µs", "vs original", "numerics"},
                                    caps={"kernel": 40}).rstrip("\n") + "".join(f"\n{x}" for x in notes)]
    return out


def chain(r: dict, g: GemmMeasurement | None = None, *, labels: dict[str, str]) -> list[str]:
    """The evidence for one row, in order (explain's chain, from the trace, the log and the measurement);
    `labels`: the audit's kernel labels (`Audit.kernel_labels`)."""
    def v(x, fmt=""):
        return "?" if _na(x) else format(x, fmt)
    out = [f"op {r['op']} in {row_label(r)} ({r['pass'] or 'no module'}): inputs {r['input_dims'] or 'not recorded'}, "
           f"strides {r['input_strides'] or 'not recorded'} -> {v(r['dtype'])} {v(r['layout'])} m={v(r['m'])} "
           f"n={v(r['n'])} k={v(r['k'])}" + (f", {v(r['groups'])} groups split along {r['group_dim']}"
                                               if not _na(r["groups"]) else "")
           + (f" (shape from the {r['shape_from']})" if r["shape_from"] == "kernel arguments" else "")]
    if _na(r["algo"]):
        out.append("cuBLASLt log: no matching line (not a cuBLASLt call, or no log)")
    else:
        agree = {True: "agrees", False: "DISAGREES"}.get(None if _na(r["log_consistent"]) else
                                                         bool(r["log_consistent"]), "has nothing to compare")
        out.append(f"cuBLASLt log: {r['log_function']} chose {r['algo']}, workspace {v(r['workspace_bytes'])} B; "
                   f"the kernel {agree}")
    name = "" if _na(r["kernel"]) else str(r["kernel"])
    out.append(f"kernel ({r['provenance']}, {r['family']}): {labels.get(name, name)}; decoded {r['kernel_short']}"
               + (f", problem shape {r['problem_shape']}" if not _na(r["problem_shape"]) else ""))
    def fig(name):
        return figure(name, None if _na(r[name]) else r[name]) or "?"
    out.append(f"{fig('calls')} calls/step, {fig('mean_us')} µs each = {fig('tflops')} "
               f"TFLOP/s = {fig('pct_peak')} % of peak; floor {fig('floor_us')} µs "
               f"({v(r['bound'])}-bound), {fig('floor_ratio')}× the floor; {fig('waves')} waves")
    if not _na(r.get("sizes_source")):
        out.append(f"group sizes ({r['sizes_source']}): {v(r['groups'])} groups of {v(r['group_min'])}–"
                   f"{v(r['group_max'])} rows (mean {v(r['group_mean'], '.1f')}), {v(r['group_empty'])} empty, "
                   f"{v(r['group_unaligned'])} not a multiple of 8, max/mean {v(r['group_imbalance'], '.2f')}"
                   + (f", {v(r['group_routings'])} routings" if not _na(r["group_routings"]) and r["group_routings"] > 1
                      else "") + f"; waves {v(r['group_waves'], '.2f')} (the largest group "
                   f"{v(r['largest_group_waves'], '.2f')}); the floor counts each expert's weights once")
    if not _na(r["align_fallback"]) and r["align_fallback"]:
        out.append(f"alignment fallback: {r['misaligned']} not a multiple of 16 bytes, kernel {r['arch']}")
    elif not _na(r["misaligned"]):
        out.append(f"misaligned leading dimension: {r['misaligned']} (the kernel is not a fallback)")
    if g is not None:
        if g.skipped or g.error:
            out.append(f"not measured: {g.skipped or g.error}")
        elif g.grouped:
            out.append(f"measured: original {v(g.original_us, ',.1f')} µs with the {g.sizes_source} "
                       "group sizes; " + ", ".join(f"{x.variant} {x.time_us:,.1f}" for x in g.grouped[1:]
                                                   if x.time_us) + " µs")
        else:
            reg = g.regret or {}
            out.append(f"measured: original {v(g.original_us, ',.1f')} µs on its path; heuristic regret "
                       f"{v(reg.get('regret_pct'), '.1f')} % (best candidate #{v(reg.get('best_rank'))})")
    return out


def _svg(fig) -> str:
    """The figure as inline SVG (the page stays one self-contained file)."""
    import io

    import matplotlib.pyplot as plt
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def figures(a: Audit, measure: Measurement | None = None, top: int = 20) -> dict[str, Any]:
    """matplotlib Figures of the audit: GPU time by class, share and % of peak per GEMM, what-if curves."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cublaslt_probe.analysis.trace import timeline_groups
    figs: dict[str, Any] = {}
    g = timeline_groups(a.timeline)
    if len(g):
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(g) + 0.8))
        ax.barh(g["label"][::-1], 100 * g["share"][::-1], color="#4c72b0")
        ax.set_xlabel("% of the step's GPU time")
        ax.set_title("GPU time by provenance, library and kind")
        figs["timeline"] = fig
    rows = a.rows.head(top)
    if len(rows):
        labels = [f"{row_label(r)}{' bwd' if r['pass'] == 'bwd' else ''} · {r['m']}×{r['n']}×{r['k']}"
                  for r in rows.to_dict("records")][::-1]
        fig, (ax1, ax2) = plt.subplots(1, 2, sharey=True, figsize=(11, 0.32 * len(rows) + 1.0))
        ax1.barh(labels, 100 * rows["share"].astype(float)[::-1], color="#55a868")
        ax1.set_xlabel("% of the step's GPU time")
        ax1.set_title("share per GEMM")
        pk = rows["pct_peak"].astype(float)[::-1]
        ax2.barh(labels, pk.fillna(0), color="#c44e52")
        ax2.set_xlabel("% of dense peak")
        ax2.set_xlim(0, 100)
        ax2.set_title("% of peak per GEMM")
        figs["gemms"] = fig
    curves = [g for g in (measure.gemms if measure is not None else []) if g.whatifs and g.original_us][:4]
    if curves:
        # against the elements added (0: the original), so that every dim shares an axis and its ticks stay
        # short integers however large the padded value is
        from matplotlib.ticker import MaxNLocator
        fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3), squeeze=False, layout="constrained")
        for ax, g in zip(axes[0], curves):
            k = g.key
            for dim in ("m", "n", "k"):
                pts = sorted((w.value, w.time_us) for w in g.whatifs
                             if w.dim == dim and w.time_us and k.get(dim) is not None)
                if pts:
                    ax.plot([0] + [p[0] - k[dim] for p in pts], [g.original_us] + [p[1] for p in pts], "o-",
                            label=f"pad {dim} from {k[dim]}")
            ax.axhline(g.original_us, color="grey", lw=0.8)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
            ax.set_title(f"{k.get('m')}×{k.get('n')}×{k.get('k')} {k.get('dtype')}", fontsize=9)
            ax.set_xlabel("elements added")
            ax.set_ylabel("µs")
            ax.legend(fontsize=7)
        figs["whatifs"] = fig
    return figs


def render_html(a: Audit, items: list[dict] | None = None, measure: Measurement | None = None,
                detail_rows: int = 12) -> str:
    """A self-contained HTML page: summary, GPU time by class, the advice, the GEMM table, figures (inline
    SVG), and for the largest GEMMs the chain of evidence (`chain`) with their measurements when given."""
    import html as H
    e = H.escape
    figs = {k: _svg(f) for k, f in figures(a, measure).items()}
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>cublaslt-probe audit</title><style>"
             "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:12px}"
             "td,th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:left}td.n{text-align:right}"
             "td,li,p,summary,h3,h4{overflow-wrap:anywhere}"
             ".note{color:#a33}.bar{background:#55a868;height:10px;display:inline-block}</style></head><body>",
             "<h1>GEMM audit</h1>", "<ul>" + "".join(
                 f"<li class='{'note' if ln.startswith('note:') else ''}'>{e(ln)}</li>" for ln in summary_lines(a))
             + "</ul>"]
    parts.append("<h2>GPU time by kind and provenance</h2>" + figs.get("timeline", "<p>no GPU time</p>"))
    parts.append("<h2>Advice</h2>")
    if items:
        entries, total, quiet = advice_entries(items)
        parts.append("<ol>" + "".join(f"<li><b>{e(head)}</b><br>evidence: {e(ev)}<br>risk: {e(risk)}</li>"
                                      for _, head, ev, risk in entries) + "</ol>")
        if total:
            parts.append(f"<p>{e(total)}</p>")
        est = estimate_entries(items)
        if est:
            parts.append(f"<h3>{e(ESTIMATES_TITLE[0].upper() + ESTIMATES_TITLE[1:])}</h3><ul>" + "".join(
                f"<li><b>{e(head)}</b><br>{e(need)}<br>evidence: {e(ev)}</li>" for head, need, ev in est) + "</ul>")
        dis = disproven_entries(items)
        if dis:
            parts.append(f"<h3>{e(DISPROVEN_TITLE[0].upper() + DISPROVEN_TITLE[1:])}</h3><ul>" + "".join(
                f"<li><b>{e(head)}</b><br>{e(said)}</li>" for head, said in dis) + "</ul>")
        if quiet:
            parts.append("<ul>" + "".join(f"<li>{e(q)}</li>" for q in quiet) + "</ul>")
    else:
        parts.append("<p>no measurements: run <code>audit --measure</code> on the GPU (or render a saved one "
                     "with <code>--from</code>) for advice.</p>")
    parts.append("<h2>GEMMs</h2>")
    head = ["share", "calls", "µs/step", "module", "pass", "op", "dtype", "layout", "m", "n", "k", "groups",
            "family", "provenance", "decoded", "logged algo", "% peak", "× floor", "waves", "flags"]
    num = {0, 1, 2, 8, 9, 10, 11, 16, 17, 18}
    body = []
    for r, cells in zip(a.rows.to_dict("records"), table_rows(a.rows)):
        share = r["share"] if r["share"] is not None and not pd.isna(r["share"]) else 0
        cells[0] = f"<span class='bar' style='width:{max(1, int(200 * share))}px'></span> {e(cells[0])}"
        body.append("<tr>" + "".join(f"<td class='n'>{c}</td>" if i in num and i else
                                     f"<td>{c if i == 0 else e(c)}</td>" for i, c in enumerate(cells)) + "</tr>")
    parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" + "".join(body) + "</table>")
    if "gemms" in figs:
        parts.append("<h2>Share and % of peak per GEMM</h2>" + figs["gemms"])
    parts.append("<h2>Per GEMM</h2>")
    if "whatifs" in figs:
        parts.append(figs["whatifs"])
    by_row = measured_rows(a.rows, measure)
    for i, r in enumerate(a.rows.head(detail_rows).to_dict("records")):
        g = by_row.get(i)
        parts.append(f"<details{' open' if i < 3 else ''}><summary><b>{e(row_label(r))}</b> {e(str(r['pass'] or ''))} "
                     f"{e(str(r['op']))} {r['m']}×{r['n']}×{r['k']}: {r['gpu_us']:,.1f} µs/step</summary><ol>"
                     + "".join(f"<li>{e(x)}</li>" for x in chain(r, g, labels=a.kernel_labels)) + "</ol>")
        if g and g.grouped:
            for title, body, notes in grouped_tables(Measurement([g])):
                parts.append(f"<h4>{e(title)}</h4><table><tr>" + "".join(f"<th>{e(c)}</th>" for c in GROUPED_TABLE)
                             + "</tr>" + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                                                 for row in body) + "</table>"
                             + "".join(f"<p>{e(x)}</p>" for x in notes))
        if g and not (g.skipped or g.error):
            for name, cols in (("candidates", ("rank", "algo_text", "kernel_label", "time_us", "ok_numerics")),
                               ("paths", ("path", "workspace", "kernel_label", "time_us")),
                               ("whatifs", ("dim", "value", "multiple", "kernel_label", "time_us"))):
                recs = getattr(g, name)
                if recs:
                    parts.append(f"<h4>{name}</h4><table><tr>" + "".join(f"<th>{HEADS.get(c, c)}</th>" for c in cols)
                                 + "</tr>" + "".join("<tr>" + "".join(f"<td>{e(html_cell(c, getattr(x, c)))}</td>"
                                                                      for c in cols) + "</tr>" for x in recs)
                                 + "</table>")
        parts.append("</details>")
    parts.append("</body></html>")
    return "\n".join(parts)
