import pathlib

import pytest

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


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
    """Exact-output tests see tables at their full width whatever the shell exports; a test that wants a
    terminal's width sets COLUMNS itself."""
    monkeypatch.delenv("COLUMNS", raising=False)
