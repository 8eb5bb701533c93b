"""A study's driver killed at any moment leaves no process behind: real drivers, real signals,
their sessions counted from /proc (``driver_kills.py``). Linux only: elsewhere the workers'
poll alone ends them, within PARENT_POLL of their initializer."""

import sys

import pytest

from training.engine import compiled_kernel as kernels

from .driver_kills import kill_at

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG and /proc are Linux's")


@pytest.mark.parametrize("moment", ["startup", "lockwait", "ddp"])
def test_a_driver_killed_while_its_workers_start_or_wait_leaves_nothing(moment):
    """SIGKILL of the driver 0.3 s after its two pool workers (or DDP ranks) were spawned,
    still importing torch, before their initializer; or while both workers wait for a kernel's
    build lock that another process holds: no process of its session is alive 2 s later
    (before the children asked for PR_SET_PDEATHSIG in their first statement, the workers and
    the resource tracker were still alive after 5 s)."""
    if moment == "lockwait" and (reason := kernels.missing_tool()) is not None:
        pytest.skip(reason)
    counts = kill_at(moment)
    assert counts["at"] >= 2 and counts[2.0] == 0, counts


@pytest.mark.parametrize("moment", ["kernel", "eager"])
def test_a_driver_killed_mid_group_leaves_nothing(moment, request):
    """SIGKILL of the driver while its workers train, under the compiled kernel (built here
    first, so the driver finds it complete) and under the eager programs: nothing alive 2 s
    later."""
    if moment == "kernel":
        request.getfixturevalue("compiled_kernel")
    counts = kill_at(moment)
    assert counts["at"] >= 2 and counts[2.0] == 0, counts


@pytest.mark.parametrize("moment", ["build-term", "build-int", "build-kill"])
def test_a_driver_stopped_while_it_compiles_leaves_no_compiler(moment):
    """SIGTERM (the study command's clean stop), Ctrl-C (SIGINT to the driver's process group)
    or SIGKILL of a driver while ninja and cc1plus compile the kernel in a fresh cache: ninja
    ends its compilers and exits, nothing of the session is alive 5 s later (before, a SIGTERM
    left sh, c++ and cc1plus running, reparented to init, and a SIGKILL ninja too)."""
    if (reason := kernels.missing_tool()) is not None:
        pytest.skip(reason)
    counts = kill_at(moment)
    assert "cc1plus" not in counts["names"] and counts[5.0] == 0, counts
