"""Kernel capture: the kernels each call launched, by CUPTI's activity API (`cupti.Activity`) over many calls,
split per call at a marker kernel launched on the same stream before each (`run_marked`, `split_by_marker`)."""
from __future__ import annotations

from cublaslt_probe.errors import CaptureError


def profile_kernels(torch, calls, marker) -> list[list[tuple[str, float]]]:
    """Run `calls` (zero-argument callables, or (setup, fn) pairs whose setup runs first) under CUPTI's activity
    API (`cupti.Activity`); the kernels each launched, in launch order, as (name, µs), named as torch.profiler
    names them (`split_by_marker`)."""
    from cublaslt_probe.gpu.cupti import activity
    rec = activity()
    rec.start()
    try:
        run_marked(torch, calls, marker)
    finally:
        evs = rec.stop()
    return split_by_marker(evs, len(calls))


def recorded(torch, fn) -> list[tuple[int, str, float]]:
    """Run `fn` under CUPTI's activity API (`cupti.Activity`) and wait for the GPU: every kernel, memset and copy
    it ran, as (start ns, name, µs) in start order, named as torch.profiler names them."""
    from cublaslt_probe.gpu.cupti import activity
    rec = activity()
    rec.start()
    try:
        fn()
        torch.cuda.synchronize()
    finally:
        evs = rec.stop()
    return evs


def run_marked(torch, calls, marker) -> None:
    """Run `calls` ((setup, fn) pairs or callables), filling `marker` (a 1-element int8 CUDA tensor) on the same
    stream before each and once after the last, then wait for the GPU: the marker's kernels split the kernel
    stream per call."""
    for call in calls:
        setup, fn = call if isinstance(call, tuple) else (None, call)
        if setup is not None:
            setup()
        marker.fill_(1)
        fn()
    marker.fill_(1)
    torch.cuda.synchronize()


def split_by_marker(evs: list, n: int) -> list[list[tuple[str, float]]]:
    """The GPU's (start, name, µs) events of a `run_marked` of `n` calls, in start order, split at the marker's
    kernel (the first event) into the (name, µs) of each call."""
    if not evs:
        raise CaptureError("CUPTI recorded no kernels for the capture's calls (the marker's neither): is another "
                           "profiler attached?")
    name = evs[0][1]
    groups: list[list[tuple[str, float]]] = []
    for _, kernel, dur in evs:
        if kernel == name:
            groups.append([])
        elif groups:
            groups[-1].append((kernel, dur))
    groups = groups[:-1]  # the closing marker opens an empty group
    if len(groups) != n:
        raise CaptureError(f"split the kernel stream into {len(groups)} groups for {n} GEMMs: "
                           "another stream or process launched kernels inside the window")
    return groups
