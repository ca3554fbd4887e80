"""Issue 36: the engine's thread count comes from the CPUs it can really use (affinity, cgroup
quota, CPUs other processes keep busy), with a validated knob; the contention benchmark's busy
neighbours start pinned and always stop."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import relaxspec
from relaxspec.engine import threads as threads_mod
from relaxspec.engine.threads import (
    ENV_THREADS,
    ThreadGovernor,
    busy_cpus,
    cgroup_cpu_limit,
    configure_threads,
    cpu_times,
    default_threads,
    others_cpus,
    parse_threads,
    resolve_threads,
    set_torch_threads,
    torch_threads_kept,
)
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.contention import SPIN, busy_neighbours, neighbour_cpus


def write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    "cpu_max,expected", [("150000 100000\n", 1.5), ("400000 100000", 4.0), ("max 100000\n", None)]
)
def test_cgroup_v2_quota(tmp_path, cpu_max, expected):
    write(tmp_path / "proc_cgroup", "0::/job/worker\n")
    write(tmp_path / "cg" / "job" / "worker" / "cpu.max", cpu_max)
    write(tmp_path / "cg" / "cpu.max", "100000 100000")  # the root's is not this process's
    assert cgroup_cpu_limit(tmp_path / "cg", tmp_path / "proc_cgroup") == expected


def test_cgroup_v2_root_group_when_the_path_is_not_mounted(tmp_path):
    write(tmp_path / "proc_cgroup", "0::/elsewhere\n")
    write(tmp_path / "cg" / "cpu.max", "250000 100000")
    assert cgroup_cpu_limit(tmp_path / "cg", tmp_path / "proc_cgroup") == 2.5


@pytest.mark.parametrize("mount", ["cpu", "cpu,cpuacct"])
@pytest.mark.parametrize("quota,expected", [("200000", 2.0), ("50000", 0.5), ("-1", None)])
def test_cgroup_v1_quota(tmp_path, mount, quota, expected):
    write(tmp_path / "proc_cgroup", "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    write(tmp_path / "cg" / mount / "docker" / "abc" / "cpu.cfs_quota_us", quota + "\n")
    write(tmp_path / "cg" / mount / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path / "cg", tmp_path / "proc_cgroup") == expected


def test_no_cgroup_files_means_unlimited(tmp_path):
    assert cgroup_cpu_limit(tmp_path / "none", tmp_path / "missing") is None
    write(tmp_path / "cg" / "cpu.max", "garbage")
    assert cgroup_cpu_limit(tmp_path / "cg", tmp_path / "missing") is None


def test_cpu_times_and_busy_cpus(tmp_path):
    # user nice system idle iowait irq softirq steal
    write(
        tmp_path / "s1", "cpu  1 1 1 1 1 1 1 1\ncpu0 100 0 0 100 0 0 0 0\ncpu1 100 0 0 100 0 0 0 0\nintr 5\n"
    )
    write(
        tmp_path / "s2", "cpu  1 1 1 1 1 1 1 1\ncpu0 110 0 0 190 0 0 0 0\ncpu1 180 0 5 105 0 0 0 0\nintr 9\n"
    )
    before, after = cpu_times(tmp_path / "s1"), cpu_times(tmp_path / "s2")
    assert before == {0: (100, 200), 1: (100, 200)}
    assert after[1] == (185, 290)
    assert busy_cpus(before, after, {0, 1}) == {1}  # cpu1: 85 of 90 jiffies busy; cpu0: 10 of 100
    assert busy_cpus(before, after, {0}) == set()  # only this process's CPUs count
    assert cpu_times(tmp_path / "missing") == {}


@pytest.mark.parametrize(
    "cpus,quota,taken,expected",
    [
        ({0, 1}, None, set(), 2),
        ({0, 1}, None, {1}, 1),  # a busy neighbour on one of two CPUs
        ({0, 1}, None, {0, 1}, 1),  # never fewer than one
        ({0, 1, 2, 3, 4, 5, 6, 7}, 1.5, set(), 1),  # quota below the affinity set
        ({0, 1, 2, 3, 4, 5, 6, 7}, 4.0, {7}, 4),
        ({2, 5}, 0.5, set(), 1),
        ({0, 1, 2, 3}, None, {3, 9}, 3),  # a busy CPU outside the set changes nothing
    ],
)
def test_default_threads(cpus, quota, taken, expected):
    assert default_threads(cpus, quota, taken) == expected


@pytest.mark.parametrize("value", [0, -1, "x", "", "1.5", 10**6, True])
def test_bad_thread_counts(value):
    with pytest.raises(RelaxSpecError, match=r"--threads must be an integer in 1\.\.1024"):
        parse_threads(value, "--threads")


def test_resolve_threads_precedence():
    assert resolve_threads(3, {ENV_THREADS: "2"}) == 3  # the flag wins
    assert resolve_threads(None, {ENV_THREADS: " 2 ", "OMP_NUM_THREADS": "4"}) == 2
    assert resolve_threads(None, {"OMP_NUM_THREADS": "4"}) is None  # torch follows it itself
    with pytest.raises(RelaxSpecError, match=ENV_THREADS):
        resolve_threads(None, {ENV_THREADS: "zero"})
    n = resolve_threads(None, {}, sample_seconds=0)
    assert 1 <= n <= len(os.sched_getaffinity(0))


def test_neighbour_cpus():
    assert neighbour_cpus(1, {0, 1}) == [1]
    assert neighbour_cpus(3, {0, 4}) == [4, 0, 4]
    assert neighbour_cpus(0, {0, 1}) == []


def test_busy_neighbours_run_pinned_and_stop():
    def spinners() -> list[int]:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        mine = f"-c\0{SPIN}\0{os.getpid()}\0"
        return [p for p in pids if _cmdline(p).endswith(mine) and _parent(p) == os.getpid()]

    with busy_neighbours(1) as cpus:
        [cpu] = cpus
        deadline = time.monotonic() + 10  # polled: a loaded machine can be slow to show it in /proc
        while not (spinning := spinners()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(spinning) == 1
        assert os.sched_getaffinity(spinning[0]) == {cpu}
    time.sleep(0.05)
    assert not os.path.exists(f"/proc/{spinning[0]}") or _state(spinning[0]) == "Z"


def test_busy_neighbours_stop_on_error():
    with pytest.raises(KeyError), busy_neighbours(1):
        raise KeyError("boom")
    children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == os.getpid()]
    assert all(SPIN not in _cmdline(int(p)) for p in children)


def test_neighbours_exit_when_orphaned():
    """A benchmark killed by a signal runs no `finally`; its neighbours stop on their own."""
    code = (
        "import subprocess, sys; from relaxspec.eval.contention import SPIN; "
        "import os; p = subprocess.Popen([sys.executable, '-c', SPIN, str(os.getpid())]); "
        "print(p.pid, flush=True)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z"


@pytest.mark.parametrize("n", [-1, 65, True])
def test_bad_neighbour_count(n):
    with pytest.raises(RelaxSpecError, match="--busy-neighbour"), busy_neighbours(n):
        pass


def test_a_bounded_spin_when_relaxspec_loads_first():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = "import os, relaxspec, torch; print(*map(os.environ.get, ['GOMP_SPINCOUNT', 'OMP_WAIT_POLICY']))"

    def run() -> str:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        return out.stdout

    assert run().split() == [relaxspec.SPIN_COUNT, "None"]
    env["OMP_WAIT_POLICY"] = "PASSIVE"  # the user's choice stands, and no spin count is added
    assert run().split() == ["None", "PASSIVE"]
    del env["OMP_WAIT_POLICY"]
    env["GOMP_SPINCOUNT"] = "7"
    assert run().split() == ["7", "None"]


class FakeMachine:
    """A clock, /proc/stat and this process's CPU time a test moves by hand (USER_HZ 100)."""

    def __init__(self, cpus: int = 2) -> None:
        self.now, self.own = 0.0, 0.0
        self.stat = {c: (0, 0) for c in range(cpus)}
        self.set_calls: list[int] = []

    def advance(self, seconds: float, busy: dict[int, float], own: float) -> None:
        """``seconds`` pass; CPU c is busy ``busy[c]`` of them (all processes); ours used ``own``."""
        self.now += seconds
        self.own += own
        for c, (b, t) in self.stat.items():
            self.stat[c] = (b + round(100 * seconds * busy.get(c, 0.0)), t + round(100 * seconds))

    def governor(self, limit: int = 2) -> ThreadGovernor:
        gov = ThreadGovernor(
            set(self.stat),
            limit,
            clock=lambda: self.now,
            read_stat=lambda: dict(self.stat),
            own_time=lambda: self.own,
            set_threads=self.set_calls.append,
        )
        gov._ticks = 100.0
        return gov


def test_others_cpus_subtracts_this_process():
    before = {0: (0, 100), 1: (0, 100)}
    after = {0: (100, 200), 1: (60, 200)}  # 1.6 CPUs busy over one second
    assert others_cpus(before, after, {0, 1}, own_seconds=1.0, clock_ticks=100) == pytest.approx(0.6)
    assert others_cpus(before, after, {0, 1}, own_seconds=2.0, clock_ticks=100) == 0.0  # never < 0
    assert others_cpus(before, before, {0, 1}, 0.0, 100) == 0.0  # no time passed


def test_governor_follows_a_neighbour_that_comes_and_goes():
    m = FakeMachine()
    gov = m.governor()
    assert gov.tick() == 2 and m.set_calls == [2]  # applied once in this thread
    m.advance(0.5, {0: 1.0, 1: 1.0}, own=1.0)
    assert gov.tick() == 2 and m.set_calls == [2]  # not due yet, nothing re-applied
    m.advance(0.5, {0: 1.0, 1: 1.0}, own=1.0)  # we used both CPUs ourselves: nobody else
    assert gov.tick() == 2
    m.advance(1.0, {0: 1.0, 1: 1.0}, own=1.5)  # a neighbour took half of CPU 1
    assert gov.tick() == 1 and m.set_calls == [2, 1]
    m.advance(1.0, {0: 1.0, 1: 1.0}, own=1.0)  # it keeps its CPU while we use one
    assert gov.tick() == 1
    m.advance(1.0, {0: 1.0, 1: 0.05}, own=1.0)  # it left
    assert gov.tick() == 2 and m.set_calls == [2, 1, 2]
    m.advance(1.0, {0: 1.0, 1: 1.0}, own=0.1)  # two neighbours: still at least one thread
    assert gov.tick() == 1


def test_governor_measures_only_while_the_engine_runs():
    m = FakeMachine()
    gov = m.governor()
    for _ in range(4):  # running alone on both CPUs, ticking every 0.5 s
        m.advance(0.5, {0: 1.0, 1: 1.0}, own=1.0)
        assert gov.tick() == 2
    m.advance(3.0, {0: 1.0, 1: 0.5}, own=0.0)  # no forwards for 3 s while others ran (a vLLM peer)
    assert gov.tick() == 2  # that window is dropped, a new one starts
    m.advance(0.5, {0: 1.0, 1: 1.0}, own=1.0)
    assert gov.tick() == 2
    m.advance(0.5, {0: 1.0, 1: 1.0}, own=1.0)
    assert gov.tick() == 2 and m.set_calls == [2]  # others took nothing while we ran


def test_governor_applies_the_count_in_every_thread_that_runs_forwards():
    m = FakeMachine()
    gov = m.governor()
    assert gov.tick() == 2  # the main thread alone
    seen = []
    worker = threading.Thread(target=lambda: seen.append(gov.tick()))
    worker.start()
    worker.join()
    # torch's OpenMP count is per thread; the main thread and a worker share the two CPUs
    assert seen == [1] and m.set_calls == [2, 1]
    assert gov.tick() == 1 and m.set_calls == [2, 1, 1]


def test_threads_share_a_larger_count():
    m = FakeMachine(cpus=8)
    gov = m.governor(limit=8)
    seen, done = [], threading.Event()

    def work() -> None:
        seen.append(gov.tick())
        done.wait()  # alive until the end: no two workers share an ident

    workers = [threading.Thread(target=work) for _ in range(3)]
    for w in workers:  # one after the other: each sees the runners so far
        w.start()
        while len(seen) < workers.index(w) + 1:
            time.sleep(0.001)
    done.set()
    for w in workers:
        w.join()
    assert seen == [4, 2, 2]  # main + 1, main + 2 (8 // 3), main + 3


def test_governor_without_proc_stat_keeps_its_count():
    gov = ThreadGovernor({0, 1}, 2, clock=lambda: 5.0, read_stat=dict, set_threads=lambda n: None)
    assert gov.tick() == 2


@pytest.fixture
def keep_torch_threads():
    import torch

    before, governor = torch.get_num_threads(), threads_mod._GOVERNOR
    yield
    torch.set_num_threads(before)
    threads_mod._GOVERNOR = governor


def test_a_count_the_user_chose_is_not_followed(monkeypatch, keep_torch_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(ENV_THREADS, raising=False)
    configure_threads(1)
    assert threads_mod._GOVERNOR is None
    monkeypatch.setenv(ENV_THREADS, "1")
    configure_threads()
    assert threads_mod._GOVERNOR is None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_torch_threads_kept_restores_a_count_changed_inside():
    import torch

    set_torch_threads(1)
    with torch_threads_kept():
        torch._C.set_num_threads(2)  # what numba's OpenMP layer does behind torch's back
    assert torch.get_num_threads() == 1
    with pytest.raises(ValueError), torch_threads_kept():
        torch._C.set_num_threads(2)
        raise ValueError  # restored on the way out of a failure too
    assert torch.get_num_threads() == 1
    with torch_threads_kept(during=2):  # vLLM's calls run on the count vLLM bound
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1


def test_our_thread_count_is_set_where_vllm_made_torchs_setter_a_no_op(monkeypatch):
    """vLLM's CPU worker replaces torch.set_num_threads in its process with a warning and no
    effect; --threads must still reach our engine's forwards (a bench with vLLM peers)."""
    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert configure_threads(2, follow=False) == 2
        assert configure_threads(1, follow=False) == 1
    finally:
        set_torch_threads(1)
