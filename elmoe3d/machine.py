"""What the machine running a command offers it: :func:`usable_cpus`, the CPUs this process
may run on (the default of every worker and job count: ``elmoe3d synth --jobs``, the sweep's
local Dask workers, the compute calibrations' processes)."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity set where the OS has one (a container's
    or ``taskset``'s limit; ``os.cpu_count()`` counts the machine's), else the machine's
    count; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):            # no affinity on this OS (macOS)
        return max(1, os.cpu_count() or 1)
