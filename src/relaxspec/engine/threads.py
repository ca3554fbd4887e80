"""How many threads the engine's torch ops use: the CPUs this process can really use.

torch's default is one OpenMP thread per logical CPU of the machine. On a shared machine that is
wrong twice: the process may be confined to fewer CPUs (``taskset``, a container's cpuset or CPU
quota), and a CPU another process keeps busy is not ours either. Every parallel region then waits
for its slowest thread, and a thread sharing a core with a busy neighbour gets a time slice only
every few milliseconds, so a tiny-model decode step (hundreds of small regions) collapses.

:func:`default_threads` counts the CPUs in this process's affinity mask, caps them at the cgroup
CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``), and leaves out CPUs
that other processes keep busy at the moment it looks (``/proc/stat`` over a short interval).
:func:`resolve_threads` lets a user override it (``--threads``, ``RELAXSPEC_THREADS``, or
``OMP_NUM_THREADS``, which torch reads itself). Where the count was chosen here,
:class:`ThreadGovernor` keeps following it while the engine runs: every second (at the next
forward) it measures how much CPU other processes took on this process's CPUs and sets torch's
threads to what is left, so a neighbour that starts later costs a share of the CPU, not a collapse.
The OpenMP wait policy (a short spin, then sleep, at barriers) is set in ``relaxspec/__init__.py``:
it must be in the environment before torch loads its OpenMP runtime.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from relaxspec.errors import RelaxSpecError

ENV_THREADS = "RELAXSPEC_THREADS"
MAX_THREADS = 1024
# A CPU counts as taken by others when it was busy at least this fraction of the sampling interval
# (this process is idle while it samples).
BUSY_FRACTION = 0.5
SAMPLE_SECONDS = 0.2
# While the engine runs: how often the governor looks, and how much of a CPU other processes must
# take (summed over this process's CPUs) before it counts as taken. Lower than BUSY_FRACTION: a
# neighbour sharing a CPU with one of our threads gets only part of it while we still use it.
FOLLOW_SECONDS = 1.0
TAKEN_SHARE = 0.4


def affinity_cpus() -> set[int]:
    """The CPUs this process may run on (``sched_getaffinity``; all of them where unsupported)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def cgroup_cpu_limit(
    root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (e.g. 1.5), or None when unlimited.

    cgroup v2: ``<root>/<path>/cpu.max`` holds ``"<quota> <period>"`` or ``"max <period>"``.
    cgroup v1: ``<root>/cpu/<path>/cpu.cfs_quota_us`` (-1 = unlimited) over ``cpu.cfs_period_us``.
    ``<path>`` comes from ``/proc/self/cgroup``; the root group is tried when it is not mounted.
    """
    paths = _cgroup_paths(proc_cgroup)
    # This process's own group where it is mounted, else the root of the hierarchy.
    for rel in dict.fromkeys((paths.get("", "/"), "/")):
        cpu_max = root / rel.lstrip("/") / "cpu.max"
        if cpu_max.exists():
            return _read_cpu_max(cpu_max)
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for rel in dict.fromkeys((paths.get("cpu", "/"), "/")):
            base = root / mount / rel.lstrip("/")
            quota = _read_number(base / "cpu.cfs_quota_us")
            period = _read_number(base / "cpu.cfs_period_us")
            if quota is not None and period:
                return quota / period if quota > 0 else None
    return None


def _cgroup_paths(proc_cgroup: Path) -> dict[str, str]:
    """``/proc/self/cgroup`` lines ``id:controllers:path`` -> {controller: path} ("" = v2)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                out[controller] = parts[2]
    return out


def _read_number(path: Path) -> float | None:
    try:
        return float(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_cpu_max(path: Path) -> float | None:
    """``cpu.max`` -> quota / period in CPUs; None if absent, unreadable or ``max``."""
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = float(fields[0]), float(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cpu_times(stat: Path = Path("/proc/stat")) -> dict[int, tuple[int, int]]:
    """Per-CPU ``(busy, total)`` jiffies from ``/proc/stat`` ({} where there is none).

    busy = user + nice + system + irq + softirq + steal; total adds idle and iowait.
    """
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        values = [int(x) for x in fields[:8]] + [0] * max(0, 8 - len(fields))
        user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
        busy = user + nice + system + irq + softirq + steal
        out[int(name[3:])] = (busy, busy + idle + iowait)
    return out


def busy_cpus(
    before: Mapping[int, tuple[int, int]], after: Mapping[int, tuple[int, int]], cpus: set[int]
) -> set[int]:
    """The CPUs of ``cpus`` busy at least :data:`BUSY_FRACTION` of the time between two samples."""
    taken = set()
    for cpu in cpus & before.keys() & after.keys():
        busy = after[cpu][0] - before[cpu][0]
        total = after[cpu][1] - before[cpu][1]
        if total > 0 and busy >= BUSY_FRACTION * total:
            taken.add(cpu)
    return taken


def default_threads(cpus: set[int], quota: float | None, taken: set[int] | None = None) -> int:
    """``min(|cpus \\ taken|, ⌊quota⌋)``, at least 1: the CPUs this process can really use."""
    free = len(cpus - (taken or set()))
    if quota is not None:
        free = min(free, math.floor(quota))
    return max(1, free)


def parse_threads(value: object, source: str) -> int:
    """A thread count from a flag or environment variable: an integer in 1..MAX_THREADS."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= MAX_THREADS:
        raise RelaxSpecError(f"{source} must be an integer in 1..{MAX_THREADS}, got {value!r}")
    return int(text)


def resolve_threads(
    threads: int | None = None, env: Mapping[str, str] | None = None, sample_seconds: float = SAMPLE_SECONDS
) -> int | None:
    """The thread count to use: ``threads`` (``--threads``), else ``RELAXSPEC_THREADS``, else
    None when ``OMP_NUM_THREADS`` is set (torch already follows it), else the usable CPUs
    (:func:`default_threads`, sampling ``/proc/stat`` for ``sample_seconds``)."""
    env = os.environ if env is None else env
    if threads is not None:
        return parse_threads(threads, "--threads")
    if env.get(ENV_THREADS, "").strip():
        return parse_threads(env[ENV_THREADS], ENV_THREADS)
    if env.get("OMP_NUM_THREADS", "").strip():
        return None
    cpus = affinity_cpus()
    taken: set[int] = set()
    if len(cpus) > 1 and sample_seconds > 0:
        before = cpu_times()
        time.sleep(sample_seconds)
        taken = busy_cpus(before, cpu_times(), cpus)
    return default_threads(cpus, cgroup_cpu_limit(), taken)


def others_cpus(
    before: Mapping[int, tuple[int, int]],
    after: Mapping[int, tuple[int, int]],
    cpus: set[int],
    own_seconds: float,
    clock_ticks: float,
) -> float:
    """CPUs' worth of time other processes used on ``cpus`` between two ``/proc/stat`` samples:
    (busy jiffies on ``cpus`` / ``clock_ticks``) minus this process's own CPU seconds, over the
    interval's length (the per-CPU total jiffies' mean). 0 when nothing elapsed."""
    shared = cpus & before.keys() & after.keys()
    busy = sum(after[c][0] - before[c][0] for c in shared)
    total = sum(after[c][1] - before[c][1] for c in shared)
    if not shared or total <= 0:
        return 0.0
    interval = total / len(shared) / clock_ticks  # seconds
    return max(0.0, busy / clock_ticks - own_seconds) / interval


class ThreadGovernor:
    """Keeps torch's thread count at the CPUs other processes leave this one, while it runs.

    :meth:`tick` is called before every forward (:func:`relaxspec.engine.kv.model_logits`); at
    most every ``interval`` seconds of running it samples ``/proc/stat`` and this process's CPU
    time, and sets ``threads = max(1, limit - ⌊others + 1 - TAKEN_SHARE⌋)`` (``limit``: the affinity mask
    capped at the cgroup quota; ``others``: :func:`others_cpus`). torch's OpenMP thread count is
    per calling thread, so each thread that runs forwards applies the current count itself.
    """

    def __init__(
        self,
        cpus: set[int],
        limit: int,
        start: int | None = None,
        interval: float = FOLLOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        read_stat: Callable[[], dict[int, tuple[int, int]]] = cpu_times,
        own_time: Callable[[], float] = time.process_time,
        set_threads: Callable[[int], None] | None = None,
    ) -> None:
        self.cpus, self.limit, self.interval = cpus, max(1, limit), interval
        self._clock, self._read_stat, self._own_time = clock, read_stat, own_time
        self._set_threads = set_threads or set_torch_threads
        self._ticks = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self._lock = threading.Lock()
        self._local = threading.local()
        # The threads that run torch work: the main thread (it loaded the models) and each thread
        # that ran a forward. They share the count (see tick).
        self._runners = {threading.main_thread().ident}
        self.threads = self.limit if start is None else max(1, min(start, self.limit))
        self._sample = (self._read_stat(), self._own_time())
        self._last_tick = self._clock()
        self._next = self._last_tick + self.interval

    def tick(self) -> int:
        """Re-measure if ``interval`` has passed; apply this thread's share of the count. Returns it.

        A window that held a gap longer than ``interval`` without forwards is dropped and a new
        one starts: the count follows what others take while this process runs, not while it
        waits (between requests, or while a bench times another engine). Each thread that runs
        forwards gets ``threads // runners`` (at least 1): libgomp keeps a team of threads per
        thread that opened one, and once its threads outnumber the CPUs it cuts every barrier's
        spin to ~100 iterations, which costs more than the second thread gains (a server's
        request threads: docs/performance.md §8).
        """
        now = self._clock()
        idle, self._last_tick = now - self._last_tick > self.interval, now
        if (idle or now >= self._next) and self._lock.acquire(blocking=False):
            try:
                if idle:
                    self._sample, self._next = (self._read_stat(), self._own_time()), now + self.interval
                else:
                    self._measure()
            finally:
                self._lock.release()
        self._runners.add(threading.get_ident())
        share = max(1, self.threads // len(self._runners))
        if getattr(self._local, "applied", None) != share:
            self._set_threads(share)
            self._local.applied = share
        return share

    def _measure(self) -> None:
        stat, own = self._read_stat(), self._own_time()
        old_stat, old_own = self._sample
        self._sample, self._next = (stat, own), self._clock() + self.interval
        if not stat:  # no /proc/stat: nothing to follow
            return
        others = others_cpus(old_stat, stat, self.cpus, own - old_own, self._ticks)
        taken = math.floor(others + 1 - TAKEN_SHARE)
        self.threads = max(1, min(self.limit, len(self.cpus) - taken))


def set_torch_threads(n: int) -> None:
    """torch's intra-op thread count, set through torch's own setter: vLLM's CPU worker replaces
    ``torch.set_num_threads`` with a no-op in its process once it has bound its threads, which
    would silently drop ``--threads`` for every row our engine runs beside an in-process vLLM
    engine (a bench with vLLM peers). vLLM's calls get its own count back
    (:func:`torch_threads_kept`)."""
    import torch

    torch._C.set_num_threads(n)


_GOVERNOR: ThreadGovernor | None = None


@contextlib.contextmanager
def torch_threads_kept(during: int | None = None) -> Iterator[None]:
    """Run a block with torch's intra-op thread count set to ``during`` (None: as it is), then
    put back the count it found, whatever the block did to it.

    Used around vLLM's calls in our process: ``during`` is the count vLLM bound its threads for,
    and the restore undoes numba's OpenMP layer (vLLM's ``ngram`` proposer runs numba in the
    engine's process), which sets the process's OpenMP thread count when it restores its own —
    torch, on the same runtime, then ran its next forwards on every CPU, contending with other
    work (docs/design.md §11)."""
    import torch

    n = torch.get_num_threads()
    if during is not None and during != n:
        set_torch_threads(during)
    try:
        yield
    finally:
        if torch.get_num_threads() != n:
            set_torch_threads(n)


def follow_cpus() -> None:
    """Before a forward: let the governor (if :func:`configure_threads` started one) adjust."""
    if _GOVERNOR is not None:
        _GOVERNOR.tick()


def configure_threads(threads: int | None = None, follow: bool = True) -> int:
    """Set torch's intra-op thread count from :func:`resolve_threads`; returns the count in use.

    When the count was chosen here (no ``--threads``, ``RELAXSPEC_THREADS`` or
    ``OMP_NUM_THREADS``) and ``follow``, a :class:`ThreadGovernor` keeps following the CPUs
    other processes take while the engine runs; a count the user chose is left alone.
    """
    import torch

    global _GOVERNOR
    n = resolve_threads(threads)
    if n is not None:
        set_torch_threads(n)
    chosen_here = threads is None and not any(
        os.environ.get(var, "").strip() for var in (ENV_THREADS, "OMP_NUM_THREADS")
    )
    _GOVERNOR = None
    if follow and chosen_here and n is not None:
        cpus = affinity_cpus()
        limit = default_threads(cpus, cgroup_cpu_limit())
        if limit > 1:  # with one CPU there is nothing to follow
            _GOVERNOR = ThreadGovernor(cpus, limit, start=n)  # n: what the start-up sample chose
    return torch.get_num_threads()
