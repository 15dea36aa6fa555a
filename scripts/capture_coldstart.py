"""Capture cold-start fixtures from real programs (run on the GPU machine).

    PYTHONPATH=. python3 scripts/capture_coldstart.py --out OUT [--only NAME,...] [--steps 6] [--budget 240]

Each program below is a step factory (`make_*`: builds the program, returns its step) that
`cublaslt_probe.gpu.coldstart.run` runs in fresh child processes, one per environment; the raw result goes to
OUT/NAME.json (what `cold-start --from` reads). Programs run in the order listed, each only if the time spent so
far is under --budget seconds; OUT/summary.json says what ran.

- llama_eager: a Llama-shaped model (2 layers, hidden 2048, intermediate 5632, 16 heads, 4 KV heads, vocabulary
  32000), bf16, eager prefill of 1 x 512 tokens; every environment of the full set (PTX JIT off and forced too).
- compiled_mlp: a torch.compile'd bf16 MLP block (LayerNorm, Linear, GELU, Linear; 2048 -> 8192 -> 2048) at
  2048 tokens: Triton compiles at step 1 with cold caches.
- sdpa_cudnn: bf16 attention forward + backward through SDPA's cuDNN backend (4 x 16 heads x 1024 x 128).
- fp8_linear: two fp8 linears through torch._scaled_mm at 16 and 2048 tokens (the builder of
  capture_programs.py).
- ptx_module: a library that ships PTX: at its first call it hands a PTX module (48 kernels) to the driver
  (cuModuleLoadData, which JIT-compiles it), then launches one of them on a torch tensor next to a bf16 matmul;
  run with PTX JIT on, off, and forced.
- ptx_only: the same PTX library through the driver API alone (no torch kernel), so that it also runs with
  CUDA_FORCE_PTX_JIT=1: torch's own kernels carry no PTX an H200 can JIT-compile.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)


def make_llama_eager():
    import torch
    from capture_programs import _build
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    model = _build(LlamaForCausalLM, cfg)
    ids = torch.randint(0, 32000, (1, 512), device="cuda")

    def step():
        with torch.no_grad():
            model(ids, use_cache=False)
    return step


def make_compiled_mlp():
    import torch
    from capture_programs import MLP
    with torch.device("cuda"):
        block = MLP(2048, 8192).to(torch.bfloat16)
    model = torch.compile(block)
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)

    def step():
        with torch.no_grad():
            model(x)
    return step


def make_sdpa_cudnn():
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(4, 16, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def step():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
    return step


def make_fp8_linear():
    from capture_programs import prog_fp8_linear
    _, step = prog_fp8_linear()
    return step


def ptx_source(kernels: int = 48, ops: int = 256) -> bytes:
    """A PTX module (ISA 7.0, sm_80: the driver JIT-compiles it for any newer GPU): `kernels` entries, each
    scaling a float array in place through a chain of `ops` FMAs."""
    lines = [".version 7.0", ".target sm_80", ".address_size 64", ""]
    for i in range(kernels):
        lines += [f".visible .entry coldstart_ptx_{i}(.param .u64 p_x, .param .u32 p_n)", "{",
                  "  .reg .pred %p<2>;", "  .reg .b32 %r<6>;", "  .reg .f32 %f<3>;", "  .reg .b64 %rd<5>;",
                  "  ld.param.u64 %rd1, [p_x];", "  ld.param.u32 %r1, [p_n];", "  mov.u32 %r2, %ctaid.x;",
                  "  mov.u32 %r3, %ntid.x;", "  mov.u32 %r4, %tid.x;", "  mad.lo.s32 %r5, %r2, %r3, %r4;",
                  "  setp.ge.s32 %p1, %r5, %r1;", "  @%p1 bra DONE;", "  cvta.to.global.u64 %rd2, %rd1;",
                  "  mul.wide.s32 %rd3, %r5, 4;", "  add.s64 %rd4, %rd2, %rd3;", "  ld.global.f32 %f1, [%rd4];"]
        lines += [f"  fma.rn.f32 %f1, %f1, 0f3F7FF{i % 10}00, 0f3A800000;" for _ in range(ops)]
        lines += ["  st.global.f32 [%rd4], %f1;", "DONE:", "  ret;", "}", ""]
    return "\n".join(lines).encode() + b"\0"


def make_ptx_module():
    import torch
    cuda = ctypes.CDLL("libcuda.so.1")
    vp, u = ctypes.c_void_p, ctypes.c_uint
    cuda.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
    cuda.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
    cuda.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    n = 1 << 20
    x = torch.ones(n, device="cuda")
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    ptx = ptx_source()
    state: dict = {}

    def step():
        if "fn" not in state:  # the library's first call: load its PTX
            mod, fn = vp(), vp()
            rc = cuda.cuModuleLoadData(ctypes.byref(mod), ptx)
            if rc:
                raise RuntimeError(f"cuModuleLoadData(PTX) returned CUDA error {rc}")
            rc = cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"coldstart_ptx_0")
            if rc:
                raise RuntimeError(f"cuModuleGetFunction returned CUDA error {rc}")
            state["mod"], state["fn"] = mod, fn
        p_x, p_n = ctypes.c_uint64(x.data_ptr()), ctypes.c_uint32(n)
        params = (vp * 2)(ctypes.cast(ctypes.byref(p_x), vp), ctypes.cast(ctypes.byref(p_n), vp))
        stream = vp(torch.cuda.current_stream().cuda_stream)
        rc = cuda.cuLaunchKernel(state["fn"], n // 256, 1, 1, 256, 1, 1, 0, stream, params, None)
        if rc:
            raise RuntimeError(f"cuLaunchKernel returned CUDA error {rc}")
        a @ a
    return step


def make_ptx_only():
    """The PTX library of `make_ptx_module` alone, through the driver API: no torch kernel runs, so the program
    also runs with CUDA_FORCE_PTX_JIT=1 (torch's own kernels carry no PTX an H200 can JIT-compile)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    vp, u = ctypes.c_void_p, ctypes.c_uint

    def check(rc, what):
        if rc:
            raise RuntimeError(f"{what} returned CUDA error {rc}")
    cuda.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
    cuda.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
    cuda.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    cuda.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
    cuda.cuCtxSetCurrent.argtypes = [vp]
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    check(cuda.cuInit(0), "cuInit")
    ctx = vp()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    n = 1 << 20
    x = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(x), n * 4), "cuMemAlloc")
    ptx = ptx_source()
    state: dict = {}

    def step():
        if "fn" not in state:
            mod, fn = vp(), vp()
            check(cuda.cuModuleLoadData(ctypes.byref(mod), ptx), "cuModuleLoadData(PTX)")
            check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"coldstart_ptx_0"), "cuModuleGetFunction")
            state["mod"], state["fn"] = mod, fn
        p_x, p_n = ctypes.c_uint64(x.value), ctypes.c_uint32(n)
        params = (vp * 2)(ctypes.cast(ctypes.byref(p_x), vp), ctypes.cast(ctypes.byref(p_n), vp))
        check(cuda.cuLaunchKernel(state["fn"], n // 256, 1, 1, 256, 1, 1, 0, None, params, None), "cuLaunchKernel")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    return step


PROGRAMS = {  # name: (factory, runs), in the order they run
    "ptx_module": ("make_ptx_module", "jit"),
    "compiled_mlp": ("make_compiled_mlp", "default"),
    "llama_eager": ("make_llama_eager", "full"),
    "fp8_linear": ("make_fp8_linear", "default"),
    "sdpa_cudnn": ("make_sdpa_cudnn", "default"),
    "ptx_only": ("make_ptx_only", "jit"),
}


def main():
    from cublaslt_probe.analysis.coldstart.breakdown import analyse
    from cublaslt_probe.gpu.coldstart import run
    from cublaslt_probe.render.coldstart import render
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--budget", type=float, default=240.0, help="start no new program after this many seconds")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per child process")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    names = [n for n in a.only.split(",") if n] or list(PROGRAMS)
    t0 = time.perf_counter()
    summary = {}
    for name in names:
        if time.perf_counter() - t0 > a.budget:
            summary[name] = {"skipped": "over the time budget"}
            continue
        factory, env_set = PROGRAMS[name]
        t = time.perf_counter()
        raw = run(f"{os.path.abspath(__file__)}:{factory}", steps=a.steps, env_set=env_set,
                  timeout=a.timeout, label=name, log=lambda m, n=name: print(n, m, flush=True), repeat=1)
        raw["command"] = f"scripts/capture_coldstart.py --only {name} --steps {a.steps}"
        raw["target"]["spec"] = f"scripts/capture_coldstart.py:{factory}"
        with open(os.path.join(a.out, f"{name}.json"), "w") as f:
            json.dump(raw, f, indent=1, default=str)
        summary[name] = {"seconds": round(time.perf_counter() - t, 1),
                         "ok": {k: bool(r.get("ok")) for k, r in raw["runs"].items()}}
        print(name, json.dumps(summary[name]), flush=True)
        try:
            print(render(analyse(raw)), flush=True)
        except Exception as e:  # noqa: BLE001  (the raw file is what matters; the analysis is re-run on the CPU)
            print(f"{name}: analysis failed: {type(e).__name__}: {e}", flush=True)
    summary["triton_cubin"] = save_triton_cubin(os.path.join(a.out, "triton_add.cubin"))
    import subprocess
    try:
        summary["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        summary["driver"] = f"nvidia-smi failed: {e}"
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


def save_triton_cubin(path: str) -> str:
    """Compile a small Triton kernel into an empty cache and keep its cubin (a real ELF for the CPU tests of
    `cupti.elf_kernels`)."""
    import glob
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        os.environ["TRITON_CACHE_DIR"] = d
        try:
            import torch
            import triton
            import triton.language as tl

            @triton.jit
            def coldstart_add_kernel(x, y, out, n, BLOCK: tl.constexpr):
                i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)
            x = torch.ones(1000, device="cuda")
            out = torch.empty_like(x)
            coldstart_add_kernel[(4,)](x, x, out, 1000, BLOCK=256)
            torch.cuda.synchronize()
            cubins = glob.glob(os.path.join(d, "**", "*.cubin"), recursive=True)
            if not cubins:
                return "no cubin written"
            shutil.copy(cubins[0], path)
            return os.path.basename(cubins[0])
        except Exception as e:  # noqa: BLE001
            return f"failed: {type(e).__name__}: {e}"


if __name__ == "__main__":
    main()
