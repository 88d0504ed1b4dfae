"""What the machine running a command offers it: :func:`usable_cpus`, the CPUs this process
may use (the default of every worker and job count: ``elmoe3d synth --jobs``, the sweep's
local Dask workers, the compute calibrations' processes)."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["usable_cpus", "cgroup_cpu_quota"]

#: Where Linux states a cgroup's CPU bandwidth limit: v2 (``cpu.max``: ``"QUOTA PERIOD"`` or
#: ``"max PERIOD"``), then v1 (``cpu.cfs_quota_us``, -1 for none, and ``cpu.cfs_period_us``).
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs a cgroup bandwidth limit grants this process (``docker --cpus``, a Kubernetes
    limit): quota / period, or None when there is none or it cannot be read."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """The CPUs this process may use, at least 1: its affinity set where the OS has one (a
    cpuset's or ``taskset``'s limit; ``os.cpu_count()`` counts the machine's), else the
    machine's count, capped by a cgroup CPU quota rounded up (:func:`cgroup_cpu_quota`)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):            # no affinity on this OS (macOS)
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)
