"""The import paths of the modules that moved into `gpu/`, `analysis/` and `render/`, kept for one release:
`import cublaslt_probe.probe` gives the module `cublaslt_probe.gpu.probe` itself (one module object, so a
name set on it is seen by the code that uses it) and warns once with its new path."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "cublaslt_probe.audit": "cublaslt_probe.analysis.audit",
    "cublaslt_probe.audit.render": "cublaslt_probe.render.audit",
    "cublaslt_probe.candidates": "cublaslt_probe.analysis.candidates",
    "cublaslt_probe.coldstart": "cublaslt_probe.analysis.coldstart",
    "cublaslt_probe.coldstart_child": "cublaslt_probe.gpu.coldstart_child",
    "cublaslt_probe.cupti": "cublaslt_probe.gpu.cupti",
    "cublaslt_probe.dataset": "cublaslt_probe.analysis.dataset",
    "cublaslt_probe.diff": "cublaslt_probe.analysis.diff",
    "cublaslt_probe.driver": "cublaslt_probe.gpu.driver",
    "cublaslt_probe.evidence": "cublaslt_probe.analysis.evidence",
    "cublaslt_probe.explain": "cublaslt_probe.analysis.explain",
    "cublaslt_probe.firstcall": "cublaslt_probe.gpu.firstcall",
    "cublaslt_probe.graphs": "cublaslt_probe.analysis.graphs",
    "cublaslt_probe.grouped": "cublaslt_probe.analysis.grouped",
    "cublaslt_probe.kinds": "cublaslt_probe.vocab",
    "cublaslt_probe.lt": "cublaslt_probe.gpu.lt",
    "cublaslt_probe.measure": "cublaslt_probe.gpu.measure",
    "cublaslt_probe.plots": "cublaslt_probe.render.plots",
    "cublaslt_probe.probe": "cublaslt_probe.gpu.probe",
    "cublaslt_probe.recorder": "cublaslt_probe.gpu.recorder",
    "cublaslt_probe.replay": "cublaslt_probe.gpu.replay",
    "cublaslt_probe.report": "cublaslt_probe.render.report",
    "cublaslt_probe.stalls": "cublaslt_probe.analysis.stalls",
    "cublaslt_probe.steps": "cublaslt_probe.analysis.steps",
    "cublaslt_probe.timing": "cublaslt_probe.gpu.timing",
    "cublaslt_probe.trace": "cublaslt_probe.analysis.trace"
}

_LONGEST_FIRST = sorted(MOVED.items(), key=lambda kv: -len(kv[0]))   # a moved module inside a moved package wins


class _Loader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        mod = importlib.import_module(self.new)
        if hasattr(mod, "__path__"):
            # a package: its loaded submodules answer to the old path too, found in sys.modules, so importing
            # one by its old path does not load it again (nor rebind the package's attribute of that name)
            for name, sub in list(sys.modules.items()):
                if name.startswith(self.new + "."):
                    sys.modules.setdefault(spec.name + name[len(self.new):], sub)
        return mod

    def exec_module(self, module) -> None:
        pass


class _OldPaths(importlib.abc.MetaPathFinder):
    """Finds an old path (`MOVED`, and the modules under a moved package) and loads the new module."""

    def find_spec(self, name: str, path=None, target=None):
        for old, new in _LONGEST_FIRST:
            if name == old or name.startswith(old + "."):
                new_name = new + name[len(old):]
                warnings.warn(f"{name} moved to {new_name}: import it from there (the old path goes in the next "
                              "release)", DeprecationWarning, stacklevel=3)
                return importlib.util.spec_from_loader(name, _Loader(new_name))
        return None


def install() -> None:
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())
