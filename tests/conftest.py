import gzip
import json
import pathlib
import shutil

import pytest

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def copy_run(tmp_path, src, trace=None, env=None, log=None, name=None):
    """A copy of the run folder `src` in tmp_path (named `name`, default src's): `trace(doc)` changes its trace's
    JSON in place, `env(doc)` returns the env.json document to write (any JSON value), `log(text)` the log's
    text. The mutations of real captures the robustness tests make."""
    from cublaslt_probe import runfiles
    dst = tmp_path / (name or pathlib.Path(src).name)
    shutil.copytree(src, dst)
    if trace is not None:
        with gzip.open(dst / runfiles.TRACE_FILE, "rt") as f:
            doc = json.load(f)
        trace(doc)
        # level 1 writes a large trace 6x faster than the default 9; the bytes read back are the same
        with gzip.open(dst / runfiles.TRACE_FILE, "wt", compresslevel=1) as f:
            f.write(json.dumps(doc))
    if env is not None:
        doc = json.loads((dst / runfiles.ENV_FILE).read_text())
        (dst / runfiles.ENV_FILE).write_text(json.dumps(env(doc)))
    if log is not None:
        (dst / runfiles.LOG_FILE).write_text(log((dst / runfiles.LOG_FILE).read_text()))
    return dst


def _gpu_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed (GPU tests run on a machine with an NVIDIA GPU: pytest -m gpu)"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch (GPU tests run on the device machine: pytest -m gpu)"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if not gpu_items:
        return
    reason = _gpu_reason()
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def fixtures():
    return FIXTURES


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch):
    """Exact-output tests see tables at their full width whatever the shell exports or an earlier test's
    command set (`set_line_width` holds for the thread); a test that wants a terminal's width sets COLUMNS
    itself."""
    from cublaslt_probe.render.text import set_line_width
    monkeypatch.delenv("COLUMNS", raising=False)
    set_line_width(None)
