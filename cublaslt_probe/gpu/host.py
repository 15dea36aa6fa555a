"""Host facts: the GPU, driver and library versions stamped on every dataset row (`environment`), and the
CPU topology a probe pins itself, its heuristic companion and its prewarm thread to (`cpu_cores`). torch is
imported inside functions; the topology's rules are pure over what sysfs says (`physical_cores`,
`parse_cpulist`)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from cublaslt_probe.errors import NoCudaDevice


def require_gpu(what: str):
    try:
        import torch
    except ImportError as e:
        raise NoCudaDevice(what, "torch is not installed: pip install 'cublaslt-probe[torch]'") from e
    if not torch.cuda.is_available():
        raise NoCudaDevice(what, "torch sees no CUDA device")
    return torch


def environment(lib=None) -> dict:
    """GPU, driver and library versions: stamped on every dataset row. Read without starting anything: the
    driver's version from /proc/driver/nvidia/version (nvidia-smi where it is missing), cupy's from its
    package's metadata unless it is imported already."""
    torch = require_gpu("environment")
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "sm_count": props.multi_processor_count,
           "cc": f"{props.major}.{props.minor}", "torch_version": torch.__version__,
           "cuda_runtime": torch.version.cuda, "driver": driver_version(), "cublaslt_version": None,
           "cupy_version": cupy_version(), "cublaslt_path": None}
    if lib is not None:
        env["cublaslt_version"] = lib.version_str
        env["cublaslt_path"] = os.path.basename(lib.path)
    return env


def driver_version(proc: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA driver's version ("580.159.04"): the kernel module's line of `proc`, else nvidia-smi's answer."""
    try:
        with open(proc) as f:
            m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", f.read())
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def cupy_version() -> str | None:
    """cupy's version: the imported module's, else its installed distribution's (cupy ships as `cupy` or a
    CUDA-specific `cupy-cuda12x`-like name), None when it is not installed. Importing cupy takes a second."""
    mod = sys.modules.get("cupy")
    if mod is not None:
        return getattr(mod, "__version__", None)
    from importlib import metadata
    for name in ("cupy-cuda13x", "cupy-cuda12x", "cupy", "cupy-cuda11x"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        names = metadata.packages_distributions().get("cupy") or []
        return metadata.version(names[0]) if names else None
    except (metadata.PackageNotFoundError, OSError, ValueError):
        return None


def physical_cores(allowed, siblings_of) -> list[int]:
    """The first allowed logical CPU of each physical core, in CPU order (pure: `siblings_of(cpu)` gives the
    logical CPUs sharing cpu's core)."""
    seen, out = set(), []
    for cpu in sorted(allowed):
        core = frozenset(c for c in siblings_of(cpu) if c in allowed) | {cpu}
        if core not in seen:
            seen.add(core)
            out.append(cpu)
    return out


def parse_cpulist(text: str) -> set[int]:
    """The CPUs of a kernel CPU list such as "0-15,32-47" (sysfs `thread_siblings_list`, `local_cpulist`)."""
    out = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _siblings(cpu: int) -> set[int]:
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            return parse_cpulist(f.read()) or {cpu}
    except (OSError, ValueError):
        return {cpu}


def gpu_local_cpus(props) -> set[int] | None:
    """The CPUs of the NUMA node the GPU hangs off (its PCI device's `local_cpulist` in sysfs), from torch's
    device properties `props`; None when unknown."""
    try:
        bdf = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        with open(f"/sys/bus/pci/devices/{bdf}/local_cpulist") as f:
            return parse_cpulist(f.read()) or None
    except (AttributeError, OSError, ValueError):
        return None


def cpu_cores(slot: int, allowed=None, siblings_of=_siblings, local=None) -> tuple[int, int, int] | None:
    """Three logical CPUs on three physical cores of their own for probe process `slot` of this host: the
    probe's own, its heuristic companion's and its prewarm thread's (`HeuristicPrewarm`), counted from the
    last core (the first ones take the system's interrupts); None when the cores this process may use are
    too few. Pinned so, none shares a core with another or with another slot's: unpinned, the
    companion's heuristic misses read longer than the probe's own, and two probes on one host slow each other. Taken
    among the CPUs `local` to the probe's GPU (`gpu_local_cpus`) when they hold the
    slot's three: a GPU's launches from a core of another NUMA node cost more host time."""
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    if local:
        near = cpu_cores(slot, [c for c in allowed if c in local], siblings_of)
        if near is not None:
            return near
    cores = physical_cores(allowed, siblings_of)
    if len(cores) < 3 * (slot + 1):
        return None
    return cores[-1 - 3 * slot], cores[-2 - 3 * slot], cores[-3 - 3 * slot]
