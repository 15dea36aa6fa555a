"""The probe's typed interface on the CPU: options checked when made, the raw record and the timing evidence."""
import dataclasses
import os
import re

import pytest

from cublaslt_probe.cases import Case
from cublaslt_probe.errors import OptionError, ProbeError
from cublaslt_probe.gpu.probe import Probe, ProbeOptions
from cublaslt_probe.gpu.timing import Timing
from cublaslt_probe.raw_record import RawRecord


@pytest.mark.parametrize("field, value", [("reps", 0), ("reps", 2.5), ("reps", True), ("heuristic_reps", 0),
                                          ("budget_ms", 0), ("budget_ms", "3"), ("mem_budget", -1),
                                          ("candidates", -1), ("candidate_reps", 0), ("flush_l2", "yes"),
                                          ("pipeline", 1)])
def test_a_bad_option_is_refused_by_name(field, value):
    with pytest.raises(OptionError, match=rf"probe option {field}="):
        ProbeOptions(**{field: value})
    assert issubclass(OptionError, ProbeError)          # the CLI turns it into one clean line


def test_options_are_frozen_and_the_probe_checks_them_before_any_gpu_work():
    o = ProbeOptions(reps=7, candidates=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.reps = 3
    with pytest.raises(OptionError, match="probe option reps=0"):
        Probe(reps=0)                                   # refused before the GPU is looked for
    with pytest.raises(OptionError, match="not both"):
        Probe(o, reps=3)


def test_the_raw_record_of_a_case_before_it_runs():
    c = Case("torch", "mm", "bf16", "NT", 16, 4096, 1024)
    r = RawRecord.of_case(c).to_dict()
    assert r["key"] == c.key and (r["blas_m"], r["blas_n"], r["blas_k"]) == (4096, 16, 1024)
    assert (r["blas_trans_a"], r["blas_trans_b"]) == ("T", "N")
    assert r["time_us"] is None and r["kernels"] == [] and r["error"] is None


def test_timing_evidence_is_the_raw_records_timing_field():
    t = Timing(10.0, (10.5, 10.0, 9.75), 5, 12.0, 3.25, 412.3456, 120.04, 2, 0,
               {"spin_us": 200.0, "enqueue_us": 150.0, "behind": 1, "gap_us": 0.5}, 17.123, "lead", 2.1234)
    assert t.min_us == 9.75
    assert t.evidence() == {"spin_us": 412.3, "enqueue_us": 120.0, "attempts": 2, "behind": 0,
                            "retaken": {"spin_us": 200.0, "enqueue_us": 150.0, "behind": 1, "gap_us": 0.5},
                            "estimate_us": 17.12, "sized_by": "estimating call", "rule": "lead", "gap_limit_us": 2.123}
    plain = Timing(1.0, (1.0,), 1, 1.0, None, None, 5.0, 1, None, None, 1.0).evidence()
    assert plain["spin_us"] is None and plain["sized_by"] == "estimating call"
    assert Timing(1.0, (1.0,), 1, 1.0, None, None, 5.0, 1, None, None, 1.0,
                  sized_by="logged call").evidence()["sized_by"] == "logged call"


def test_a_heuristic_companion_that_cannot_start_says_why():
    """The companion process loads torch's cuBLASLt; where it cannot (here: no GPU), asking it fails with the
    reason, and the probe then measures in its own process."""
    from cublaslt_probe.errors import CaptureError
    from cublaslt_probe.gpu.heuristic_helpers import HeuristicCompanion
    from cublaslt_probe.gpu.lt import Problem
    comp = HeuristicCompanion()
    try:
        with pytest.raises(CaptureError, match="heuristic companion could not start: .*(torch|CUDA|cuda)"):
            comp.ask(("key",), Problem(16, 16, 16), 5)
        assert not comp.asked
    finally:
        comp.close()
    assert not comp.proc.is_alive()


def test_each_probe_its_companion_and_its_prewarm_thread_get_physical_cores_of_their_own():
    from cublaslt_probe.gpu.host import cpu_cores, physical_cores

    def smt(cpu):                       # 8 cores, two threads each: cpu c and c + 8 share a core
        return {cpu % 8, cpu % 8 + 8}
    assert physical_cores(range(16), smt) == list(range(8))
    assert cpu_cores(0, range(16), smt) == (7, 6, 5)      # the last cores: the first take the interrupts
    assert cpu_cores(1, range(16), smt) == (4, 3, 2)      # another worker of the host: three other cores
    assert cpu_cores(2, range(16), smt) is None           # no three cores of its own left: not pinned
    # a container given both threads of three cores: no two of the three share a core
    trio = cpu_cores(0, [2, 10, 3, 11, 4, 12], smt)
    assert len({frozenset(smt(c)) for c in trio}) == 3
    assert cpu_cores(0, [5, 13, 6, 14], smt) is None      # two cores only
    with pytest.raises(OptionError, match="cpu_slot=-1"):
        ProbeOptions(cpu_slot=-1)


def test_a_probe_takes_its_cores_on_its_gpus_numa_node_when_the_node_has_them():
    from cublaslt_probe.gpu.host import cpu_cores, parse_cpulist

    def smt(cpu):                       # two nodes of 8 cores, two threads each: cpu c and c + 16 share a core;
        return {cpu % 16, cpu % 16 + 16}   # node 0 holds cores 0-7, node 1 cores 8-15
    node0, node1 = parse_cpulist("0-7,16-23"), parse_cpulist("8-15,24-31")
    assert node0 == set(range(8)) | set(range(16, 24))
    assert cpu_cores(0, range(32), smt) == (15, 14, 13)                   # no GPU node known: the last cores
    assert cpu_cores(0, range(32), smt, local=node0) == (7, 6, 5)         # a GPU on node 0
    assert cpu_cores(1, range(32), smt, local=node0) == (4, 3, 2)         # the second worker on node 0
    assert cpu_cores(1, range(32), smt, local=node1) == (12, 11, 10)      # a second worker on node 1
    # a node without the slot's three cores left: the whole host's, as without a node
    assert cpu_cores(2, range(32), smt, local=node0) == cpu_cores(2, range(32), smt) == (9, 8, 7)
    # a node outside the cores this process may use
    assert cpu_cores(0, range(8, 16), smt, local=node0) == (15, 14, 13)
    assert parse_cpulist("3\n") == {3} and parse_cpulist("") == set()


def test_a_gpus_local_cpus_are_read_from_its_pci_device():
    """Read from a real PCI device of this machine's sysfs (the GPU's, on the GPU host)."""
    import glob
    import types

    from cublaslt_probe.gpu.host import gpu_local_cpus, parse_cpulist
    devices = [d for d in sorted(glob.glob("/sys/bus/pci/devices/*")) if os.path.exists(d + "/local_cpulist")]
    if not devices:
        pytest.skip("this machine's sysfs lists no PCI device with a local_cpulist")
    bdf = os.path.basename(devices[0])
    dom, bus, rest = bdf.split(":")
    props = types.SimpleNamespace(pci_domain_id=int(dom, 16), pci_bus_id=int(bus, 16),
                                  pci_device_id=int(rest.split(".")[0], 16))
    with open(devices[0] + "/local_cpulist") as f:
        assert gpu_local_cpus(props) == parse_cpulist(f.read()) != set()
    assert gpu_local_cpus(types.SimpleNamespace(pci_domain_id=0xffff, pci_bus_id=0xff, pci_device_id=0x1f)) is None
    assert gpu_local_cpus(object()) is None          # a torch without the PCI fields


def test_the_cpu_slot_comes_from_devices_or_the_launcher():
    from cublaslt_probe.sweep import cpu_slot
    assert cpu_slot({}) == 0
    assert cpu_slot({"LOCAL_RANK": "3"}) == 3
    assert cpu_slot({"SLURM_LOCALID": "2", "LOCAL_RANK": "1"}) == 1
    assert cpu_slot({"CUBLASLT_PROBE_SLOT": "1", "LOCAL_RANK": "0"}) == 1
    assert cpu_slot({"LOCAL_RANK": "x"}) == 0


def test_heuristic_questions_are_keyed_by_every_field_of_the_problem():
    """Two Cases share one heuristic measurement only when their cuBLASLt problems are equal field by field."""
    from cublaslt_probe.gpu.heuristic_helpers import heuristic_groups
    from cublaslt_probe.gpu.operands import lt_problem
    a = Case("torch", "mm", "bf16", "NT", 16, 4096, 4096)
    same = [Case("lt", "mm", "bf16", "NT", 16, 4096, 4096), Case("torch-lt", "mm", "bf16", "NT", 16, 4096, 4096)]
    other = [Case("torch", "mm", "bf16", "TN", 16, 4096, 4096), Case("torch", "mm", "fp16", "NT", 16, 4096, 4096),
             Case("torch", "addmm", "bf16", "NT", 16, 4096, 4096), Case("torch", "mm", "bf16", "NT", 16, 4096, 4095)]
    items = [({"key": c.key}, c) for c in [a, *same, *other]]
    groups, problems = heuristic_groups(items, lambda c: 1 << 20)
    assert len(groups) == 1 + len(other)
    assert [r["key"] for r in groups[lt_problem(a, 1 << 20).key()]] == [a.key] + [c.key for c in same]
    for key, p in problems.items():
        assert key == dataclasses.astuple(p)
    # the workspace limit is part of the question
    groups, _ = heuristic_groups([({"key": a.key}, a), ({"key": same[0].key}, same[0])],
                                  lambda c: 1 << 20 if c.backend == "torch" else 32 << 20)
    assert len(groups) == 2


def test_the_driver_layer_opens_only_a_driver_this_process_has_loaded():
    """`driver.Clock` in a process that has run no CUDA work (this one: no torch) says so in one line, naming
    the library and the fix. (That it opens only a libcuda already mapped, RTLD_NOLOAD, cannot be told apart
    here, on a machine with no driver to load.)"""
    import sys

    from cublaslt_probe.errors import CaptureError
    from cublaslt_probe.gpu.driver import Clock
    assert "torch" not in sys.modules
    with pytest.raises(CaptureError, match=r"^the CUDA driver \(libcuda\.so\.1\) is not loaded in this process: "
                                           r"run CUDA work with torch first") as e:
        Clock()
    assert "\n" not in str(e.value)


def test_a_records_fields_are_the_cases_own():
    """`Case.as_dict` (every raw record starts from it) gives each field by name, in order, as
    `dataclasses.asdict` gave them."""
    c = Case("lt", "addmm", "fp8", "NT", 16, 4096, 1024, 3)
    assert c.as_dict() == dataclasses.asdict(c)
    assert list(c.as_dict()) == [f.name for f in dataclasses.fields(Case)]
    assert RawRecord.of_case(c).to_dict()["batch"] == 3 and RawRecord.of_case(c).to_dict()["key"] == c.key


@pytest.mark.parametrize("rows,cols,transposed,batch,offset", [
    (1, 4096, False, 1, 0), (1, 4096, True, 1, 1024), (4096, 1, True, 1, 2048), (7, 5, False, 1, 3072),
    (7, 5, True, 1, 0), (7, 5, True, 3, 1024), (7, 5, False, 3, 4096), (1, 1, True, 2, 0)])
def test_an_operand_view_is_what_slicing_viewing_and_transposing_the_buffer_gives(rows, cols, transposed, batch,
                                                                                   offset):
    """`operand_view` (one `as_strided` per operand in the builder) stands for the three calls the builder made
    before: slice the buffer at `offset`, view it as (batch,) (rows, cols) or (cols, rows), transpose the
    last two dimensions when the operand is stored transposed. numpy's strides, in elements, are the judge."""
    import numpy as np

    from cublaslt_probe.gpu.operands import operand_view
    buf = np.arange(offset + batch * rows * cols + 64, dtype=np.float32)
    shape = (cols, rows) if transposed else (rows, cols)
    x = buf[offset:offset + batch * rows * cols].reshape(((batch,) if batch > 1 else ()) + shape)
    x = x.swapaxes(-1, -2) if transposed else x
    size, stride, at = operand_view(rows, cols, transposed, batch, offset)
    assert size == x.shape
    assert at == offset
    assert tuple(s // buf.itemsize for s in x.strides) == stride   # torch reads size-1 dims' strides too
    flat = at + sum(i * s for i, s in zip(np.indices(size), stride))   # each element's place in the buffer
    assert np.array_equal(buf[flat], x)


def test_the_probe_has_no_experiment_switches_and_its_plan_decides_the_helpers():
    """The settled experiments are the only path (docs/decisions.md): no option turns them off. A plan under
    HELPERS_FROM_GEMMS, or no pipeline, starts no companion and no prewarm thread; an unknown plan (a sweep's)
    does."""
    from cublaslt_probe.gpu.probe import HELPERS_FROM_GEMMS, uses_helpers
    for name in ("prewarm", "estimate_behind", "replay_calls", "logged_estimate", "pooled_cupy"):
        with pytest.raises(TypeError, match=name):
            ProbeOptions(**{name: True})
    assert uses_helpers(ProbeOptions()) and uses_helpers(ProbeOptions(plan=HELPERS_FROM_GEMMS))
    assert not uses_helpers(ProbeOptions(plan=HELPERS_FROM_GEMMS - 1))
    assert not uses_helpers(ProbeOptions(pipeline=False)) and not uses_helpers(ProbeOptions(plan=1, pipeline=False))
    for bad in (-1, 2.5, True, "9"):
        with pytest.raises(OptionError, match=re.escape(f"plan={bad!r}")):
            ProbeOptions(plan=bad)
