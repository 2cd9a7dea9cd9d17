"""stepkit.pool: results in task order, a task's exception re-raised, a dead worker named."""

from __future__ import annotations

import os
import signal

import pytest

from stepkit.pool import RemoteTraceback, WorkerDied, exit_reason, run_pool


def _square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


_STATE: dict = {}


def _init(offset: int) -> None:
    _STATE["offset"] = offset


def _offset(x: int) -> int:
    return x + _STATE["offset"]


def _kill_self_on_3(x: int) -> int:
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def _exit_on_2(x: int) -> int:
    if x == 2:
        os._exit(7)
    return x


def _raise_on_4(x: int) -> int:
    if x == 4:
        raise KeyError(f"no such thing {x}")
    return x


def _bad_init() -> None:
    raise ValueError("cannot set up")


def test_results_come_back_in_task_order_from_several_workers():
    out = run_pool(_square, list(range(40)), 3)
    assert [v for v, _ in out] == [x * x for x in range(40)]
    assert len({pid for _, pid in out}) > 1 and os.getpid() not in {pid for _, pid in out}
    assert run_pool(_square, [], 3) == []


def test_initializer_runs_in_each_worker():
    assert run_pool(_offset, [1, 2, 3, 4], 2, initializer=_init, initargs=(100,)) == [101, 102, 103, 104]


def test_a_killed_worker_fails_the_pool_naming_its_task_and_signal():
    with pytest.raises(WorkerDied, match=r"worker for item 3 died: SIGKILL"):
        run_pool(_kill_self_on_3, list(range(8)), 2, describe=lambda t: f"item {t}")


def test_a_worker_that_exits_names_its_exit_status():
    with pytest.raises(WorkerDied, match=r"worker for 2 died: exit status 7"):
        run_pool(_exit_on_2, list(range(6)), 2)


def test_a_task_exception_is_reraised_with_the_worker_traceback():
    with pytest.raises(KeyError, match="no such thing 4") as ei:
        run_pool(_raise_on_4, list(range(8)), 2)
    assert isinstance(ei.value.__cause__, RemoteTraceback) and "_raise_on_4" in str(ei.value.__cause__)


def test_a_failing_initializer_fails_the_pool_instead_of_respawning():
    with pytest.raises(RuntimeError, match="set-up failed") as ei:
        run_pool(_offset, [1, 2], 2, initializer=_bad_init)
    assert "cannot set up" in str(ei.value.__cause__)


def test_exit_reason_names_signals_and_statuses():
    assert exit_reason(-9) == "SIGKILL" and exit_reason(-15) == "SIGTERM"
    assert exit_reason(3) == "exit status 3" and exit_reason(None) == "exit status unknown"
