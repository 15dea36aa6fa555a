"""The rounds of a save made with `--repeat` (CPU): one run per environment, the median of its rounds
(`median_runs`), and each figure of the breakdown with its spread over the rounds (`combine_rounds`)."""
from __future__ import annotations

import statistics

from cublaslt_probe.analysis.coldstart.envs import STORAGE_READ_MIN
from cublaslt_probe.analysis.coldstart.runs import fmt_ms, step_walls, storage_read, usable, windows


def rounds_of(result: dict) -> list[dict]:
    """The rounds of a save: its runs (round 1), then each later round's runs (`--repeat`; none in older saves)."""
    return [result.get("runs") or {}] + [r for r in (result.get("repeats") or []) if isinstance(r, dict) and r]


# causes a later round cannot show: the first reads of files from storage happen once per machine (round 1)
ONCE_PER_MACHINE = ("file_cache",)


def spread(values: list[float]) -> dict:
    """A figure over the rounds: its median and its spread (min, max)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def within_noise(size: float, measured: list[float]) -> bool:
    """Whether a figure of that size is within the noise of what the rounds measured: no larger than their spread
    (max − min), so the rounds cannot tell it from zero. One round, or rounds that all measured the same, have no
    spread: never within noise."""
    return len(measured) >= 2 and 0 < max(measured) - min(measured) and abs(size) <= max(measured) - min(measured)


def median_runs(rounds: list[dict]) -> tuple[dict, dict, list[str]]:
    """One run per environment, each the median of that environment's completed runs over the rounds by step 1
    (the lower median of an even count), in round 1's order (a run that round 1 lacks, skipped on load, after);
    the environments that ran once as the first round to have them made them.
    The breakdown of these runs adds up as one round's does, and each of its differences is taken between
    typical runs. The cold run is the median of the cold runs whose step 1 read less than `STORAGE_READ_MIN` from
    storage and of cold_again (each: empty compile caches, the operating system's file cache warm): a cold run that
    read its files from storage happens once per machine, and is reported apart. Returns (runs by name, the round
    each came from by name, notes on what was left out)."""
    first, out, chosen, left = rounds[0], {}, {}, []
    names = list(first) + [n for r in rounds[1:] for n in r if n not in first]
    for name in dict.fromkeys(names):
        if name == "cold_again":
            continue
        pool = [(k, r[name]) for k, r in enumerate(rounds, 1) if usable(r.get(name))]
        if name == "cold":
            read = [(k, x) for k, x in pool if storage_read(windows(x).get("step1")) >= STORAGE_READ_MIN]
            again = [(1, first["cold_again"])] if usable(first.get("cold_again")) else []
            if read and len(pool) - len(read) + len(again):
                pool = [p for p in pool if p not in read] + again
                left += [f"the cold run of round {k} read {storage_read(windows(x).get('step1')) / 2**20:.1f} MiB "
                         f"from storage in step 1 ({fmt_ms(step_walls(x)[0])}): the first reads of a fresh machine, "
                         "left out of the median cold run (the others found those files in the file cache)"
                         for k, x in read]
        if not pool:
            k = next(k for k, r in enumerate(rounds, 1) if name in r)
            out[name], chosen[name] = rounds[k - 1][name], {"round": k, "step1_s": []}
            continue
        k, run = sorted(pool, key=lambda p: step_walls(p[1])[0])[(len(pool) - 1) // 2]
        out[name], chosen[name] = run, {"round": k, "step1_s": [step_walls(x)[0] for _, x in pool]}
    return out, chosen, left


def combine_rounds(med: dict, per: list[dict], rounds: list[dict], chosen: dict, left: list[str]) -> dict:
    """The breakdown of the median runs (`med`, `median_runs`) with each figure's spread over the rounds `per`
    (each round's own breakdown: step 1, excess, unexplained, each cause as measured, 0 in a round without it;
    `spread`) and whether a cause is within noise (its size no larger than its spread: `within_noise`).
    The unexplained rest is within noise when no larger than the spread of the excess or of the rounds' own
    unexplained. Causes of `ONCE_PER_MACHINE` are left out of the spreads (a later round cannot show them)."""
    ok = [a for a in per if a.get("baseline") == med["baseline"] and a.get("excess_s") is not None]
    out = dict(med)
    out["evidence"] = list(med["evidence"]) + left
    fig = {k: spread([a[k] for a in ok]) for k in ("step1_s", "excess_s", "unexplained_s")}
    comps = []
    for c in med["components"]:
        byr = [next((x for x in a["components"] if x["cause"] == c["cause"]), None) for a in ok]
        measured = [(x["measured_s"] or 0.0) if x else 0.0 for x in byr]
        extra = {} if c["cause"] in ONCE_PER_MACHINE else {
            "spread": spread(measured), "rounds_s": measured, "within_noise": within_noise(c["seconds"], measured)}
        comps.append({**c, **extra})
    out["components"] = comps
    out["noise_s"] = max(fig["excess_s"]["max"] - fig["excess_s"]["min"],
                         fig["unexplained_s"]["max"] - fig["unexplained_s"]["min"])
    out["unexplained_within_noise"] = len(ok) >= 2 and abs(out["unexplained_s"]) <= out["noise_s"]
    out["rounds"] = {"n": len(ok), "made": len(per), "figures": fig,
                     "chosen": {k: v["round"] for k, v in chosen.items()}}
    out["table"] = _rounds_table(med["table"], chosen)
    return out


def _rounds_table(table: list[dict], chosen: dict) -> list[dict]:
    """The median runs' table with, per run, the round it came from, how many runs it is the median of and the
    spread of their step 1."""
    out = []
    for t in table:
        c = chosen.get(t["run"]) or {"round": 1, "step1_s": []}
        row = {**t, "rounds": len(c["step1_s"]), "round": c["round"]}
        if len(c["step1_s"]) >= 2:
            row["spread"] = {"step1_s": spread(c["step1_s"])}
        out.append(row)
    return out
