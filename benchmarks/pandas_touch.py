"""pytest plugin: which tests build a pandas object, and how long each test takes. It answers whether CI's second
suite (the oldest pandas `pyproject.toml` allows, `.ci/run`) could run only the tests that depend on pandas.

    PYTHONPATH=benchmarks PANDAS_TOUCH_OUT=touch.tsv python -m pytest -q -p pandas_touch -p no:cacheprovider

writes one line per test (node id, 1 when a DataFrame or Series was built during its setup, call or teardown,
else 0, seconds) and prints per test file: tests, tests that built one, seconds. A file counts as depending on
pandas when any of its tests does: a module-scoped fixture builds its frames during the first test only.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict

import pytest
from pandas.core.generic import NDFrame

_built = [False]
_rows: list[tuple[str, bool, float]] = []
_init = NDFrame.__init__


def _noting_init(self, *args, **kwargs):
    _built[0] = True
    return _init(self, *args, **kwargs)


NDFrame.__init__ = _noting_init       # every DataFrame and Series goes through it, whichever constructor


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _built[0] = False
    t = time.perf_counter()
    yield
    _rows.append((item.nodeid, _built[0], time.perf_counter() - t))


def pytest_sessionfinish(session):
    out = os.environ.get("PANDAS_TOUCH_OUT")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.writelines(f"{n}\t{int(b)}\t{s:.3f}\n" for n, b, s in _rows)
    files: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    for n, b, s in _rows:
        acc = files[n.split("::")[0]]
        acc[0] += 1
        acc[1] += b
        acc[2] += s
    dep = [v for v in files.values() if v[1]]
    free = [(k, v) for k, v in files.items() if not v[1]]
    total = sum(v[2] for v in files.values())
    print(f"\npandas_touch: {len(_rows)} tests in {len(files)} files, {total:.1f} s; files that build a pandas "
          f"object: {len(dep)} ({sum(v[2] for v in dep):.1f} s); files that never do: {len(free)} "
          f"({sum(v[2] for _, v in free):.1f} s)")
    for k, v in sorted(free, key=lambda kv: -kv[1][2]):
        print(f"pandas_touch: no pandas object: {k}: {v[0]} tests, {v[2]:.1f} s")
