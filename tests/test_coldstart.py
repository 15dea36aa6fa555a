"""cold-start on the CPU: the breakdown, the verdicts and the provenance, from runs captured on an H200
(tests/fixtures/coldstart/, see its PROVENANCE.md), and the pure helpers of the CUPTI layer on real bytes."""
from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from cublaslt_probe.analysis.coldstart.breakdown import analyse, forced_jit
from cublaslt_probe.analysis.coldstart.observed import observed_provenance
from cublaslt_probe.analysis.coldstart.runs import (
    Runs,
    compile_seconds,
    compute_cache_written,
    lt_calls_per_step,
    new_files,
    new_problems,
    ptx_loads,
    steady,
    step_hosts,
    step_walls,
    usable,
    windows,
)
from cublaslt_probe.analysis.coldstart.saved import load
from cublaslt_probe.cli import main
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.gpu import cupti
from cublaslt_probe.gpu.coldstart import target_args
from cublaslt_probe.gpu.coldstart_step import cold_start_step
from cublaslt_probe.render.coldstart import render

FIX = Path(__file__).parent / "fixtures" / "coldstart"
PROGRAMS = ("llama_eager", "compiled_mlp", "fp8_linear", "ptx_module", "sdpa_cudnn", "ptx_only")


@pytest.fixture(scope="module")
def raw():
    return {name: load(FIX / f"{name}.json.gz") for name in PROGRAMS}


@pytest.fixture(scope="module")
def analysed(raw):
    return {name: analyse(r) for name, r in raw.items()}


def _cause(a, cause):
    return next((c for c in a["components"] if c["cause"] == cause), None)


# --- the breakdown adds up and hides nothing ------------------------------------------------------------------
@pytest.mark.parametrize("name", PROGRAMS)
def test_breakdown_adds_up_to_the_excess_of_step_one(raw, analysed, name):
    a = analysed[name]
    walls = step_walls(raw[name]["runs"]["cold"])
    assert a["step1_s"] == walls[0]
    assert len(walls) == 6 and a["steady_s"] == statistics.median(walls[2:])
    assert a["excess_s"] == pytest.approx(walls[0] - a["steady_s"], abs=1e-12)
    total = sum(c["seconds"] for c in a["components"]) + a["unexplained_s"]
    assert total == pytest.approx(a["excess_s"], abs=1e-9)
    assert all(c["seconds"] >= 0 for c in a["components"])
    assert abs(a["unexplained_pct"]) < 15  # the target on these programs
    text = render(a)
    # the residual as a person reads it: no negative number; causes that over-explain the excess are said so
    label = "unexplained" if a["unexplained_s"] >= 0 else "causes beyond the excess (noise between the runs)"
    line = next(x for x in text.splitlines() if x.strip().startswith(label))
    assert f"{abs(a['unexplained_s']) * 1e3:.1f}" in line and f"{abs(a['unexplained_pct']):.1f}%" in line, line
    assert "-" not in line.replace(label, ""), line
    for c in a["components"]:
        assert c["label"] in text


def test_telescoping_differences_are_the_measured_step_ones(raw, analysed):
    runs = raw["llama_eager"]["runs"]
    s1 = {n: step_walls(r)[0] for n, r in runs.items() if usable(r)}
    a = analysed["llama_eager"]
    assert _cause(a, "ptx_jit")["seconds"] == pytest.approx(s1["cold"] - s1["warm"])
    assert _cause(a, "initialisation")["seconds"] == pytest.approx(s1["warm"] - s1["preinit"])
    assert _cause(a, "module_loading")["seconds"] == pytest.approx(s1["preinit"] - s1["eager"])


def test_a_negative_difference_counts_zero_and_keeps_what_was_measured(analysed):
    c = _cause(analysed["compiled_mlp"], "module_loading")  # EAGER's step 1 was 57 ms slower: noise
    assert c["seconds"] == 0 and c["measured_s"] < 0
    assert any("-57.4 ms" in e for e in c["evidence"])


# --- runtime compilation: detected where it happened, not elsewhere --------------------------------------------------
def test_compiled_program_is_runtime_compilation_and_a_warm_cache_removes_it(raw, analysed):
    a = analysed["compiled_mlp"]
    assert a["compilation"]["observed"]
    assert {"triton", "inductor"} <= set(a["compilation"]["mechanisms"])
    comp = _cause(a, "runtime_compilation")
    assert comp["seconds"] > 2.0  # cold − warm step 1, less the autotuning a warm cache also skips
    assert _cause(a, "autotuning")["seconds"] == pytest.approx(0.121921 - 0.00243, abs=1e-6)
    runs = raw["compiled_mlp"]["runs"]
    cold1, warm1 = windows(runs["cold"])["step1"], windows(runs["warm"])["step1"]
    assert len(cold1["triton_kernels"]) == 3 and "triton_kernels" not in warm1
    assert new_files(warm1, "TRITON_CACHE_DIR") == {}
    assert compile_seconds(cold1) > 3 * compile_seconds(warm1)
    assert "runtime compilation observed" in render(a)


def test_ptx_module_is_runtime_compilation_by_the_driver(raw, analysed):
    a = analysed["ptx_module"]
    assert a["compilation"]["observed"] and set(a["compilation"]["mechanisms"]) == {"ptx-jit"}
    loads = ptx_loads(raw["ptx_module"]["runs"]["cold"])
    assert [c["name"] for c in loads] == ["cuModuleLoadData"] and loads[0]["seconds"] > 0.5
    assert compute_cache_written(raw["ptx_module"]["runs"]["cold"]) == 2
    assert _cause(a, "ptx_jit")["seconds"] > 0.6
    # a warm ComputeCache served the JIT output: a hint, not a compilation
    assert any("warm ComputeCache" in h for h in a["compilation"]["hints"])


def test_forced_ptx_jit_is_detected_and_timed(raw, analysed):
    fj = forced_jit(raw["ptx_only"])
    runs = raw["ptx_only"]["runs"]
    assert fj["ran"] and fj["detected"]
    s1 = {n: step_walls(r)[0] for n, r in runs.items() if usable(r)}
    assert fj["seconds"] == pytest.approx(s1["forcejit"] - s1["warm"])
    assert fj["seconds"] > 0.4
    # the forced run with its ComputeCache warm compiled again and wrote nothing: the cache does not spare it
    assert s1["forcejit_warm"] > 0.4 and compute_cache_written(runs["forcejit_warm"]) == 0
    # with JIT disabled and an empty cache the PTX cannot load (CUDA_ERROR_JIT_COMPILATION_DISABLED)
    assert not runs["nojit"]["ok"] and "error 223" in runs["nojit"]["error"]
    assert any("it needs PTX JIT" in w for w in analysed["ptx_only"]["what_if"])
    assert any("failed (CUDA error 223)" in h for h in analysed["ptx_only"]["compilation"]["hints"])
    # torch programs cannot run forced at all: their kernels carry no PTX for this GPU
    fl = forced_jit(raw["llama_eager"])
    assert fl["ran"] is False and "no kernel image" in fl["error"]


def test_cudnn_attention_is_ptx_jit_with_a_cold_compute_cache(analysed):
    a = analysed["sdpa_cudnn"]
    assert set(a["compilation"]["mechanisms"]) == {"ptx-jit"}
    assert _cause(a, "ptx_jit")["seconds"] > 1.5  # 2.0 s of 2.3 s at step 1 on the H200
    assert any("libcudnn_engines_runtime_compiled" in h for h in a["compilation"]["hints"])


def test_eager_fp8_program_is_not_runtime_compilation(analysed):
    a = analysed["fp8_linear"]
    assert not a["compilation"]["observed"] and a["compilation"]["mechanisms"] == {}
    assert a["compilation"]["verdict"].startswith("no runtime compilation observed")
    assert {"initialisation", "module_loading", "heuristics"} <= {c["cause"] for c in a["components"]}
    assert not any(c["cause"] in ("runtime_compilation", "ptx_jit") for c in a["components"])


def test_eager_llama_jit_compiles_cudnn_ptx(raw, analysed):
    """Seen on the H200: the eager Llama step's attention goes to cuDNN, which hands the driver a PTX kernel
    (nopCudnnHardwareDetection) and makes it load its JIT compiler; the ComputeCache fills at step 1."""
    a = analysed["llama_eager"]
    mech = a["compilation"]["mechanisms"]
    assert set(mech) == {"ptx-jit"}
    assert any("libnvidia-ptxjitcompiler" in e for e in mech["ptx-jit"])
    prov = observed_provenance(raw["llama_eager"])
    assert set(prov) == {"nopCudnnHardwareDetection"} and prov["nopCudnnHardwareDetection"]["mechanism"] == "ptx-jit"
    assert any("CUDA_FORCE_PTX_JIT=1 the program failed" in w and "no kernel image" in w for w in a["what_if"])


def test_heuristic_misses_are_new_problems_times_the_measured_miss(raw, analysed):
    runs = raw["llama_eager"]["runs"]
    newp, lines = new_problems(runs["eager"])
    assert (newp, lines) == (6, 16)
    calls = lt_calls_per_step(runs["preinit"])
    miss = (steady(step_hosts(runs["nocache"])) -
            steady(step_hosts(runs["preinit"]))) / calls
    assert _cause(analysed["llama_eager"], "heuristics")["seconds"] == pytest.approx(newp * miss)
    assert 50e-6 < miss < 400e-6  # REFERENCE: a bf16 miss is ~150 µs


# --- provenance ---------------------------------------------------------------------------------------------------
def test_observed_provenance_names_triton_and_ptx_kernels(raw):
    prov = observed_provenance(raw["compiled_mlp"])
    assert set(prov) == {"triton_poi_fused_add_2", "triton_poi_fused_gelu_1", "triton_red_fused_native_layer_norm_0"}
    assert all(v == {**v, "provenance": "runtime-compiled", "mechanism": "triton", "evidence": "observed"}
               for v in prov.values())
    ptx = observed_provenance(raw["ptx_module"])
    assert set(ptx) == {f"coldstart_ptx_{i}" for i in range(48)}
    assert observed_provenance(raw["fp8_linear"]) == {}


# --- the CUPTI layer's pure parts, on real bytes ------------------------------------------------------------------
def _capture_script():
    spec = importlib.util.spec_from_file_location("capture_coldstart", Path(__file__).parent.parent / "scripts" /
                                                  "capture_coldstart.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_image_kind_and_kernels_of_a_real_cubin():
    data = (FIX / "triton_add.cubin").read_bytes()
    assert cupti.image_kind(data[:16]) == "cubin"
    assert cupti.elf_kernels(lambda off, n: data[off:off + n]) == (["coldstart_add_kernel"], 1)
    assert cupti.image_kind(_capture_script().ptx_source(2, 4)[:16]) == "ptx"
    assert cupti.image_kind(b"\x00" * 16) == "unknown"
    assert cupti.elf_kernels(lambda off, n: b"\x00" * n) == ([], 0)


@pytest.mark.parametrize("name,base", [("cuLinkAddData_v2", "cuLinkAddData"), ("cuMemAlloc_v2", "cuMemAlloc"),
                                       ("cuModuleLoadDataEx", "cuModuleLoadDataEx"),
                                       ("cuMemAllocAsync_ptsz", "cuMemAllocAsync"),
                                       ("cuLibraryLoadData", "cuLibraryLoadData")])
def test_base_name(name, base):
    assert cupti.base_name(name) == base


def test_every_watched_call_was_resolved_by_the_installed_cupti(raw):
    watched = set(raw["llama_eager"]["runs"]["cold"]["cupti"]["watched"])
    bases = {cupti.base_name(n) for n in watched}
    assert {"cuModuleLoadData", "cuLibraryLoadData", "cuLinkAddData", "cuLinkComplete", "cuMemAlloc"} <= bases
    assert bases <= {n for ns in cupti.WATCH.values() for n in ns}


# --- inputs and the CLI ---------------------------------------------------------------------------------------------
def test_cli_renders_a_saved_run():
    res = CliRunner().invoke(main, ["cold-start", "--from", str(FIX / "compiled_mlp.json.gz")])
    assert res.exit_code == 0, res.output
    assert "runtime compilation, Triton via torch.compile (cold cache)" in res.output
    assert "verdict: runtime compilation observed" in res.output
    res = CliRunner().invoke(main, ["cold-start", "--from", str(FIX / "fp8_linear.json.gz"), "--format", "json"])
    a = json.loads(res.output)
    assert a["compilation"]["observed"] is False and a["baseline"] == "cold"


@pytest.mark.parametrize("args,msg,code", [
    (["cold-start"], "no program", 2),
    (["cold-start", "--from", "nope.json"], "cannot read nope.json", 1),
    (["cold-start", "--from", "x.json", "--", "python", "s.py"], "either --from", 2),
    (["cold-start", "--envs", "cold,tepid", "--", "python", __file__], "unknown environment(s) tepid", 2),
    (["cold-start", "--steps", "2", "--", "python", __file__], "at least 3", 2),
    (["cold-start", "--repeat", "0", "--", "python", __file__], "--repeat", 2),
    (["cold-start", "--", "python", "missing_script.py"], "missing_script.py: no such script", 1),
])
def test_cli_errors_are_one_line(args, msg, code):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == code and msg in res.output
    assert "Traceback" not in res.output
    assert len([ln for ln in res.output.strip().splitlines() if ln.startswith("Error: ")]) == 1


def test_without_torch_a_run_is_one_no_gpu_line(tmp_path):
    """A real child process that cannot import torch (this CPU machine): one line, not a table of failures."""
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: the children would run")
    script = tmp_path / "prog.py"
    script.write_text("def step():\n    pass\n")
    res = CliRunner().invoke(main, ["cold-start", "--envs", "cold", "--", "python", str(script)])
    assert res.exit_code == 1
    assert res.output.startswith("Error: no CUDA device: `cold-start`") and "cannot import torch" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_file_that_is_not_a_result(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"a": 1}')
    with pytest.raises(ProbeError, match="not a cold-start result"):
        load(p)


def test_targets():
    with pytest.raises(ProbeError, match="module level"):
        target_args(lambda: None)
    args, desc = target_args(cold_start_step)
    assert args == ["--func", "cublaslt_probe.gpu.coldstart_step:cold_start_step"] and desc["kind"] == "func"
    args, _ = target_args(["python", __file__, "--x"])
    assert args[0] == "--script" and args[-1] == "--x"


def test_cold_start_step_is_a_no_op_outside_a_run():
    with cold_start_step():
        pass


def test_runs_name_the_part_each_run_plays(raw):
    """`Runs` names the run each term of the breakdown is read from (the baseline, the compile run, the explained
    run, the warm step), on llama_eager's real runs and with runs taken away or failed as a damaged save has them;
    the breakdown reads its evidence from the run so named."""
    d = raw["llama_eager"]
    runs = d["runs"]
    r = Runs(runs)
    assert (r.baseline_name, r.compile_name, r.explained_name, r.warm_step_name) == ("cold", "cold", "eager", "warm")
    no_eager = {n: x for n, x in runs.items() if n != "eager"}
    assert (Runs(no_eager).explained_name, Runs(no_eager).warm_step_name) == ("preinit", "warm")
    causes = {c["cause"]: c for c in analyse({**d, "runs": no_eager})["components"]}
    assert causes["heuristics"]["evidence"][0].startswith("preinit step 1: 16 cuBLASLt matmul calls")
    assert causes["allocator"]["how"] == "CUPTI driver allocation calls (preinit)" and "module_loading" not in causes
    failed = {n: ({**x, "ok": False} if n in ("cold", "warm") else x) for n, x in runs.items()}
    f = Runs(failed)
    assert (f.baseline_name, f.explained_name, f.warm_step_name) == ("preinit", "eager", "eager")
    a = analyse({**d, "runs": failed})
    assert a["baseline"] == "preinit" and [c["cause"] for c in a["components"]] == \
        ["module_loading", "heuristics", "allocator"]        # no cold caches or initialisation without cold, warm
    ptx = raw["ptx_only"]["runs"]
    forced_only = Runs({n: ({**x, "ok": False} if n in ("cold", "warm") else x) for n, x in ptx.items()})
    assert forced_only.ok("forcejit") and forced_only.baseline_name is None   # a what-if is never the baseline
    assert Runs(raw["llama_eager"]["runs"]) == Runs(r)   # a mapping of the same runs, however it is wrapped
