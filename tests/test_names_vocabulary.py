"""One vocabulary for how a kernel came to exist (docs/provenance.md is its home): what the package and the
docs say of a library-selected family (nvjet, xmma, cuBLAS's CUTLASS kernels, ...) never calls its kernels
generated, JIT-compiled or compiled at run time, and no text anywhere uses "run-time generated", a mechanism
the vocabulary does not have."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cublaslt_probe.names import GRAMMARS
from cublaslt_probe.names import classes as C
from cublaslt_probe.names.classify import FAMILY_CLASSES

ROOT = Path(__file__).resolve().parent.parent
# words of another mechanism: generated (at run time), JIT, compiled at run time / on the fly
_OTHER_MECHANISM = re.compile(r"\bgenerated\b|\bJIT\b|JIT-|compiled (at run|while|on the fly)|run-?time[- ]compil",
                              re.IGNORECASE)
_NOT_A_MECHANISM = re.compile(r"run-?time[- ]generated|generated at run[- ]time|generated on the fly", re.IGNORECASE)
LIBRARY_SELECTED = {f for f, t in FAMILY_CLASSES.items() if t.value[1] == C.LIBRARY_SELECTED}


def _texts():
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "cublaslt_probe").rglob("*.py")]
    for p in sorted(files):
        for no, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            yield p, no, line


def test_the_library_selected_families_are_the_cublas_ones():
    assert {"nvjet", "xmma", "cutlass", "cutlass3x", "legacy", "gemv", "gemmSN", "splitk_reduce"} <= LIBRARY_SELECTED


@pytest.mark.parametrize("name", sorted(g.name for g in GRAMMARS.values() if g.family in LIBRARY_SELECTED))
def test_a_library_selected_grammar_speaks_of_no_other_mechanism(name):
    g = next(g for g in GRAMMARS.values() if g.name == name)
    texts = [g.summary, *g.notes] + [m.meaning for m in g.meanings()]
    bad = [t for t in texts if _OTHER_MECHANISM.search(t)]
    assert not bad, f"{name}: {bad}"


def test_no_text_calls_kernels_run_time_generated():
    bad = [f"{p.relative_to(ROOT)}:{no}: {line.strip()}" for p, no, line in _texts() if _NOT_A_MECHANISM.search(line)]
    assert not bad, "\n".join(bad)


def test_the_decoder_docs_family_rows_of_library_selected_families_speak_of_no_other_mechanism():
    rows = [ln for ln in (ROOT / "docs" / "decoder.md").read_text(encoding="utf-8").splitlines()
            if re.match(r"^\| `(\w+)` \|", ln) and re.match(r"^\| `(\w+)` \|", ln).group(1) in LIBRARY_SELECTED]
    assert any(r.startswith("| `nvjet` |") for r in rows)
    bad = [r for r in rows if _OTHER_MECHANISM.search(r.split("|")[2])]
    assert not bad, bad
