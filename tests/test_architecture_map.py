"""docs/architecture.md is a map of what is: every module of the package is named in its folder's rows of
"What each folder owns", and every name there is a module or package that exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "cublaslt_probe"


def _table() -> dict[str, set[str]]:
    """folder (``cublaslt_probe/``, ``gpu/``, ...) -> the module names its rows list (``trace/`` for a package)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## What each folder owns", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    folder = None
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("folder", "---"):
            continue
        folder = cells[0].strip("`") or folder
        out.setdefault(folder, set()).update(re.findall(r"`([\w/]+)`", cells[1]))
    return out


def _modules(folder: Path) -> set[str]:
    names = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return names | {p.name + "/" for p in folder.iterdir() if (p / "__init__.py").exists()}


def test_every_module_is_on_the_map_and_every_name_on_it_exists():
    table = _table()
    folders = {"cublaslt_probe/": PKG} | {p.name + "/": p for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert set(table) == set(folders), "the folders of the table are the package and its folders"
    for name, path in folders.items():
        have = _modules(path) - (set(folders) if name == "cublaslt_probe/" else set())
        assert table[name] == have, (f"{name}: missing from docs/architecture.md {sorted(have - table[name])}; "
                                     f"named there but absent {sorted(table[name] - have)}")


def test_every_module_of_a_package_inside_a_folder_is_named_in_its_paragraph():
    """"Packages inside the folders": analysis/trace/, analysis/audit/, analysis/coldstart/ and render/plots/ each
    name every module."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split("## Packages inside the folders")[1]
    for pkg in ("analysis/trace", "analysis/audit", "analysis/coldstart", "render/plots"):
        part = text.split(f"`{pkg}/`", 1)[1].split("\n\n`", 1)[0]
        named = set(re.findall(r"`(\w+)(?:\.py)?`", part))
        have = {p.stem for p in (PKG / pkg).glob("*.py") if p.stem != "__init__"}
        assert have <= named, f"{pkg}/: missing from docs/architecture.md {sorted(have - named)}"
