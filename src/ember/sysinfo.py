"""What machine ember runs on: physical cores, memory, the ISA the core picked, versions; and the
thread counts it accepts."""

from __future__ import annotations

import os
import platform
import warnings
from pathlib import Path

from ember.errors import EmberError, EmberWarning

THREADS_PER_CPU_LIMIT = 4  # more threads than this many per logical CPU are refused


def _allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def available_cpus() -> int:
    """Logical CPUs this process may run on."""
    return max(1, len(_allowed_cpus()))


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (hyper-threads counted once)."""
    cores = set()
    for cpu in _allowed_cpus():
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            cores.add(("?", str(cpu)))
    return max(1, len(cores))


def checked_threads(n_threads: int | None, what: str = "n_threads") -> int:
    """The compute threads to use: n_threads, or the physical cores when None.

    More than THREADS_PER_CPU_LIMIT threads per logical CPU is an EmberError (the threads would
    only wait for each other: a thousand of them on two cores look like a hang); more than the
    physical cores is allowed with a warning (each core then time-slices several threads, which
    is slower than one thread per core).
    """
    if n_threads is None:
        return physical_cores()
    if isinstance(n_threads, bool) or not isinstance(n_threads, int):
        raise EmberError(f"{what} must be an integer, got {n_threads!r}")
    limit = THREADS_PER_CPU_LIMIT * available_cpus()
    if not 1 <= n_threads <= limit:
        raise EmberError(f"{what} must be between 1 and {limit} ({THREADS_PER_CPU_LIMIT} per CPU of this "
                         f"machine), got {n_threads}")
    cores = physical_cores()
    if n_threads > cores:
        warnings.warn(EmberWarning(f"{n_threads} threads is more than the {cores} physical cores this process can "
                                   f"use, which is slower; the default is {cores}"), stacklevel=3)
    return n_threads


def physical_memory() -> int:
    """Bytes of memory this process can use: the machine's RAM, or less under a cgroup limit."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        total = 1 << 62
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def system_info() -> dict:
    import numpy

    from ember import _core
    from ember.version import __version__

    return {
        "ember": __version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "cpu": cpu_name(),
        "isa": _core.isa(),
        "available_isas": _core.available_isas(),
        "cpu_flags": {k: v for k, v in _core.cpu_flags().items() if v},
        "physical_cores": physical_cores(),
        "default_threads": physical_cores(),
        "logical_cpus": available_cpus(),
        "memory_bytes": physical_memory(),
    }
