"""The kernel capture's names (`gpu/cupti.kernel_name`) are torch.profiler's: CUPTI hands over a kernel's mangled
name, and the capture demangles it as kineto does. Checked on names CUPTI and torch.profiler gave for the same
GEMM on the H200 (benchmarks/results/kernel_capture.json, written by benchmarks/bench_kernel_capture.py)."""
import json
from pathlib import Path

from cublaslt_probe.gpu.cupti import kernel_name

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "kernel_capture.json"


def _pairs() -> list[tuple[str, str]]:
    runs = json.loads(RESULTS.read_text())
    theirs = runs["torch_profiler"][0]["first"]["kernels"]
    ours = runs["cupti_activity"][0]["first"]["kernels"]
    assert len(theirs) == len(ours) == 2
    return [(raw, name) for (raw, _), (name, _) in zip(ours, theirs)]


def test_a_mangled_kernel_is_named_as_torch_profiler_names_it():
    (plain, plain_t), (mangled, mangled_t) = _pairs()
    assert mangled.startswith("_ZN8cublasLt") and mangled_t.startswith("void cublasLt::splitKreduce_kernel<")
    cache: dict = {}
    assert kernel_name(mangled.encode(), cache) == mangled_t
    assert cache == {mangled.encode(): mangled_t}


def test_an_unmangled_kernel_keeps_its_name():
    (plain, plain_t), _ = _pairs()
    assert plain == plain_t and plain.startswith("nvjet_")
    assert kernel_name(plain.encode(), {}) == plain_t


def test_a_name_no_demangler_reads_is_kept():
    assert kernel_name(b"_Z-not-a-name", {}) == "_Z-not-a-name"


def test_a_cubins_size_is_read_from_its_header():
    """`cupti.elf_size` (the size a lazily loaded library's module has, which ties it to its load call) on a
    cubin Triton wrote on the H200: its program headers come after its section headers and end the file."""
    from cublaslt_probe.gpu.cupti import elf_size
    cubin = (Path(__file__).resolve().parent / "fixtures" / "coldstart" / "triton_add.cubin").read_bytes()
    assert elf_size(cubin[:64]) == len(cubin)
    assert elf_size(b"//\n.version 8.0" + bytes(64)) is None and elf_size(cubin[:32]) is None


def test_the_caller_of_a_call_is_the_first_frame_past_the_callee():
    """`CallStack.caller` names the shared object that called into a library, from inside a callback that library
    makes (the driver's callbacks in the Recorder): here glibc's qsort calls a comparison made with ctypes, so the
    frame past glibc's is libffi's (ctypes' foreign call into qsort)."""
    import ctypes

    from cublaslt_probe.gpu.cupti import CallStack
    stack, libc = CallStack(), ctypes.CDLL(None)
    seen = []

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
    def cmp(a, b):
        seen.append((stack.caller(past=("libc.so",)), stack.caller()))
        return a[0] - b[0]
    arr = (ctypes.c_int * 3)(3, 1, 2)
    libc.qsort(arr, 3, ctypes.sizeof(ctypes.c_int), cmp)
    assert list(arr) == [1, 2, 3] and seen
    assert all(past_libc.startswith(("libffi", "_ctypes")) and driver is None for past_libc, driver in seen), seen
