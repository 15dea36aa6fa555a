"""Every Python import line of the documentation (README.md, docs/*.md) runs: a documented import that fails
is a broken promise to the reader. Lines of a module this machine lacks (torch on a CPU machine) are skipped
with the module named; every `cublaslt_probe` line runs here."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^\s*```")
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+.+|import\s+([\w.]+)(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+)*)"
                     r"\s*(#.*)?$")


def import_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, statement) of each import line inside a fenced code block of `path`; a parenthesised
    import is joined into one statement."""
    out, inside, pending = [], False, None
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            continue
        if pending is not None:
            pending[1] += " " + line.strip()
            if ")" in line:
                out.append((pending[0], pending[1]))
                pending = None
            continue
        text = line.split("#", 1)[0].rstrip()
        if re.match(r"^\s*from\s+[\w.]+\s+import\s*\(", text) and ")" not in text:
            pending = [no, text.strip()]
        elif _IMPORT.match(line) and not text.lstrip().startswith(("$", ">")):
            out.append((no, text.strip()))
    return out


CASES = [(p, no, stmt) for p in DOCS for no, stmt in import_lines(p)]


def test_the_documentation_has_import_lines_to_check():
    files = {p.name for p, _, _ in CASES}
    assert {"README.md", "audit.md", "diff.md", "decoder.md"} <= files, files


@pytest.mark.parametrize("path, no, stmt", CASES, ids=[f"{p.name}:{no}" for p, no, _ in CASES])
def test_a_documented_import_runs(path, no, stmt):
    m = _IMPORT.match(stmt) or re.match(r"^\s*from\s+([\w.]+)\s+import", stmt)
    top = (m.group(1) or m.group(2)).split(".")[0]
    if top != "cublaslt_probe" and importlib.util.find_spec(top) is None:
        pytest.skip(f"{path.name}:{no} imports {top}, not installed here")
    try:
        exec(compile(stmt, f"{path.name}:{no}", "exec"), {})
    except ImportError as e:
        pytest.fail(f"{path.relative_to(ROOT)}:{no}: `{stmt}` fails: {e}")
