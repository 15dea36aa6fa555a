"""GPU tests of `cold-start` on the runtime compilers other than torch's: each program of
scripts/coldstart_programs/ in real child processes, its mechanism named from the timed entry points."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from cublaslt_probe.analysis.coldstart.breakdown import analyse
from cublaslt_probe.analysis.coldstart.observed import shipped_by
from cublaslt_probe.analysis.coldstart.routes import JAX_WRITES, jit_calls, xla_autotune_seconds, xla_compiled, xla_hits
from cublaslt_probe.analysis.coldstart.runs import Runs, windows
from cublaslt_probe.gpu.coldstart import run

PROGS = Path(__file__).resolve().parent.parent / "scripts" / "coldstart_programs"


def _need(module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed on this machine: its compile route cannot be tried")


def windows_cpu(run):
    return sum(w["process"]["cpu_s"] for w in run["windows"])


def _run(name, envs="cold,warm"):
    raw = run(["python", str(PROGS / f"{name}_prog.py")], steps=4, envs=envs, timeout=300, repeat=1)
    bad = {k: r.get("error") for k, r in raw["runs"].items() if not r.get("ok")}
    assert not bad, bad
    # every window keeps the process's own accounting (CPU seconds, its compilers' CPU, reads from storage)
    for r in raw["runs"].values():
        for w in r["windows"]:
            assert {"cpu_s", "children_cpu_s", "majflt", "inblock_bytes"} <= set(w["process"]), w["name"]
        assert windows_cpu(r) > 0
    a = analyse(raw)
    total = sum(c["seconds"] for c in a["components"]) + a["unexplained_s"]
    assert total == pytest.approx(a["excess_s"], abs=1e-9)
    assert "torch.compile" not in a["compilation"]["verdict"] or name == "torch_compile"
    return raw, a


@pytest.mark.gpu
def test_cupy_is_nvrtc_cupy_and_its_cache_is_isolated():
    _need("cupy")
    raw, a = _run("cupy", envs="cold,warm,preinit")
    # CuPy's own cuBLAS handle, first GEMM and first reduction are initialised apart, each timed
    pre = raw["runs"]["preinit"]["preinit"]
    assert all(isinstance(pre.get(k), float) for k in ("cupy_cublas_handle", "cupy_first_gemm_fp32",
                                                         "cupy_first_reduction")), pre
    assert "nvrtc-cupy" in a["compilation"]["mechanisms"], a["compilation"]
    cold, warm = raw["runs"]["cold"], raw["runs"]["warm"]
    assert cold["env"]["caches_before"]["CUPY_CACHE_DIR"] == 0 and cold["cache_written"]["CUPY_CACHE_DIR"]["count"]
    assert warm["env"]["caches_before"]["CUPY_CACHE_DIR"] > 0
    assert jit_calls(windows(warm)["step1"], "cupy.nvrtc") == 0


@pytest.mark.gpu
def test_plain_triton_is_triton_direct_not_torch_compile():
    _need("triton")
    raw, a = _run("triton")
    assert "triton-direct" in a["compilation"]["mechanisms"] and "triton" not in a["compilation"]["mechanisms"]
    assert "Triton JIT (direct)" in a["compilation"]["verdict"]
    assert any(c["cause"] == "triton_direct" for c in a["components"])


# the same numpy alias the Numba program sets (numba-cuda 0.30.4 needs np.row_stack, which numpy 2.5 removed)
NUMBA_CHECK = ("import numpy as np\n"
               "np.row_stack = getattr(np, 'row_stack', np.vstack)\n"
               "from numba import cuda\n"
               "def k(x):\n    x[0] = 1.0\n"
               "cuda.jit('void(float32[:])')(k)\n")


@pytest.mark.gpu
def test_numba_is_numba():
    _need("numba")
    # numba's CUDA target must compile at all with the numpy installed (with the alias the program sets)
    p = subprocess.run([sys.executable, "-c", NUMBA_CHECK], capture_output=True, text=True, timeout=120)
    if p.returncode:
        pytest.skip("numba cannot compile a CUDA kernel on this machine: "
                    + (p.stderr.strip().splitlines() or ["no output"])[-1])
    raw, a = _run("numba")
    assert "numba" in a["compilation"]["mechanisms"], a["compilation"]
    assert jit_calls(windows(raw["runs"]["cold"])["step1"], "numba.nvvm") >= 1
    # its kernel, loaded lazily from the cubin Numba linked (cuLibraryLoadData), is observed as Numba's
    seen = {k: v for k, v in a["kernels"].items() if "coldstart_saxpy_tanh" in k}
    assert seen and all(v["provenance"] == "runtime-compiled" and v["mechanism"] == "numba" for v in seen.values()), \
        a["kernels"]
    # the call that loaded it was Numba's (through its CUDA bindings), not a library shipping its kernels
    recs = [m for m in raw["runs"]["cold"]["modules"]["step1"]["records"]
            if any("coldstart_saxpy_tanh" in k for k in m.get("kernels") or [])]
    assert recs and all(m.get("caller") and not shipped_by(m) for m in recs), recs


@pytest.mark.gpu
def test_jax_is_xla_compile_and_its_autotuning_is_timed():
    _need("jax")
    raw, a = _run("jax", envs="cold,warm,noautotune")
    assert "xla" in a["compilation"]["mechanisms"], a["compilation"]
    assert xla_autotune_seconds(Runs(raw["runs"])) is not None
    assert raw["runs"]["cold"]["xla_flags"]["set"]
    # the warm run's XLA flags are the cold run's, so JAX's persistent cache serves the executable, unless the
    # cold compile was under JAX's minimum compile time for its cache: then nothing was written, and the analysis
    # says the warm run compiled again
    c1, w1 = (windows(raw["runs"][n])["step1"] for n in ("cold", "warm"))
    if jit_calls(c1, JAX_WRITES):
        assert xla_hits(w1) >= 1 and not xla_compiled(w1), w1.get("jit_s")
    else:
        assert any(c["cause"] == "xla_compile_warm" for c in a["components"]), a["components"]
    # cuBLASLt's kernels, loaded while XLA's autotuner timed them, were loaded by cuBLASLt (shipped, chosen by
    # timing, never runtime-compiled); XLA's own GEMM fusions were loaded by XLA
    recs = [m for m in raw["runs"]["cold"]["modules"]["step1"]["records"] if m.get("loaded_by")]
    lib = [m for m in recs if any(k.startswith("nvjet") for k in m.get("kernels") or [])]
    own = [m for m in recs if any(k.startswith("gemm_fusion") for k in m.get("kernels") or [])]
    assert own and not any(shipped_by(m) for m in own), own[:3]
    assert lib and all(str(shipped_by(m)).startswith("libcublas") for m in lib), recs[:3]
    assert not [k for k, v in a["kernels"].items() if k.startswith("nvjet") and v["provenance"] != "autotuned"]


@pytest.mark.gpu
def test_torch_compile_is_still_triton_via_torch_compile():
    raw, a = _run("torch_compile")
    assert "triton" in a["compilation"]["mechanisms"] and "triton-direct" not in a["compilation"]["mechanisms"]


@pytest.mark.gpu
@pytest.mark.parametrize("name,module,items", [
    ("jax_first_use", "jax", ("jax_backend", "jax_first_transfer")),
    ("numba_first_use", "numba", ("numba_context", "numba_first_transfer"))])
def test_a_frameworks_own_initialisation_in_step_1_is_timed_apart(name, module, items):
    """A program whose step 1 is its first use of JAX or Numba: the preinit run starts that framework apart (each
    item timed) and the initialisation cause names it."""
    _need(module)
    if module == "numba":
        p = subprocess.run([sys.executable, "-c", NUMBA_CHECK], capture_output=True, text=True, timeout=120)
        if p.returncode:
            pytest.skip("numba cannot compile a CUDA kernel on this machine")
    raw, a = _run(name, envs="cold,warm,preinit")
    pre = raw["runs"]["preinit"]["preinit"]
    assert all(isinstance(pre.get(k), float) for k in items), pre
    init = next(c for c in a["components"] if c["cause"] == "initialisation")
    assert {"jax": "JAX's backend", "numba": "Numba's context"}[module] in init["label"]
    assert any(items[0] in e for e in init["evidence"])
