"""GPU tests of the probe's kernel capture (`cupti.Activity` under `kernel_capture.profile_kernels`): it names each
kernel, memset and copy as torch.profiler names them, with the same GPU durations, and takes turns with
torch.profiler in one process. Skipped with a reason without a GPU."""
import statistics

import pytest

from cublaslt_probe.cases import Case

pytestmark = pytest.mark.gpu

# GEMMs whose kernel lists hold what the capture must name: a memset before an nvjet kernel, a CUTLASS 2 kernel
# (a demangled template) after a memset, a split-K kernel and its reduction (a long template with a parameter
# list); and beside them a device-to-device copy and an elementwise kernel
CASES = ["torch|mm|bf16|NN|4096|3584|3584|1", "torch-lt|mm|bf16|TN|4|3584|3584|1", "torch|mm|bf16|NT|16|4096|4096|1",
         "lt|mm|bf16|NT|16|4096|4096|1"]


@pytest.fixture(scope="module")
def calls():
    import torch

    from cublaslt_probe.gpu.operands import Builder
    b = Builder()
    out = []
    for key in CASES:
        c = Case.from_key(key)
        built = b.build(c)
        out.append((lambda c=c: b.set_flags(c), built.fn))
    src = torch.randn(1 << 20, device="cuda")
    dst = torch.empty_like(src)
    out.append(lambda: dst.copy_(src))
    out.append(lambda: src.mul_(1.0001))
    for setup, fn in (x if isinstance(x, tuple) else (None, x) for x in out):
        if setup:
            setup()
        fn()
    torch.cuda.synchronize()
    return torch, out


def torch_profiler_kernels(torch, calls, marker) -> list[list[tuple[str, float]]]:
    """The same capture through torch.profiler (the probe's capture before `cupti.Activity`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from cublaslt_probe.gpu.kernel_capture import run_marked, split_by_marker
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_marked(torch, calls, marker)
    evs = sorted((e.start_ns(), e.name(), e.duration_ns() / 1e3) for e in prof.profiler.kineto_results.events()
                 if e.device_type() == DeviceType.CUDA)
    return split_by_marker(evs, len(calls))


def test_the_capture_names_what_torch_profiler_names_with_its_durations(calls):
    from cublaslt_probe.gpu.kernel_capture import profile_kernels
    torch, fns = calls
    marker = torch.zeros(1, dtype=torch.int8, device="cuda")
    # the two captures take turns, three rounds each, each right after the same calls ran untimed: our captures
    # after a torch.profiler session must keep their durations (kineto leaves its TSC timestamp callback in
    # force; before `Activity` registered its own clock, every kernel read 2.1x long after one: 307 against
    # 146 µs); the names must agree in every capture, the durations as medians
    from cublaslt_probe.gpu.kernel_capture import run_marked
    ours, theirs = [], []
    for _ in range(3):
        for capture, into in ((lambda: profile_kernels(torch, fns, marker), ours),
                              (lambda: torch_profiler_kernels(torch, fns, marker), theirs)):
            for _ in range(3):
                run_marked(torch, fns, marker)
            into.append(capture())
    again = profile_kernels(torch, fns, marker)   # after torch.profiler sessions in the same process
    names = [[n for n, _ in g] for g in theirs[0]]
    for capture in ours + theirs[1:] + [again]:
        assert [[n for n, _ in g] for g in capture] == names
    flat = [n for g in names for n in g]
    assert "Memset (Device)" in flat and "Memcpy DtoD (Device -> Device)" in flat, flat
    assert any(n.startswith("nvjet_") for n in flat) and any(n.startswith("void cutlass::Kernel2<") for n in flat)
    assert any(n.startswith("void cublasLt::splitKreduce_kernel<") and n.endswith(")") for n in flat), flat
    # durations: each kernel's median over our three captures within 15 % (or 1 µs) of its median over
    # torch.profiler's three
    for i, g in enumerate(names):
        for j, name in enumerate(g):
            med = statistics.median(o[i][j][1] for o in ours)
            ref = statistics.median(t[i][j][1] for t in theirs)
            assert abs(med - ref) <= max(0.15 * ref, 1.0), (name, [o[i][j][1] for o in ours],
                                                           [t[i][j][1] for t in theirs])
