"""What machine ember runs on: physical cores, the ISA the core picked, versions."""

from __future__ import annotations

import os
import platform
from pathlib import Path


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
        "logical_cpus": os.cpu_count(),
    }
