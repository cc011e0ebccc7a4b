"""The second execution lane (deepspeed_ext/lanes.py) on its own, without processes: its op runs
on another thread at the same time as this thread's, with this thread's grad mode and the lane's
ep group and wait; an exception of either comes out here as itself."""

from __future__ import annotations

import threading

import pytest
import torch

from octodsl.deepspeed_ext.errors import PlanLaunchError
from octodsl.deepspeed_ext.lanes import Lane
from octodsl.layers import expert_parallel as epl

CPU = torch.device("cpu")
GROUP = object()  # stands for the lane's process group


def wait(work) -> None:
    raise AssertionError("no all-to-all here")


def test_the_lane_runs_beside_this_thread_with_its_group():
    lane, seen = Lane(GROUP, CPU, [0, 1]), {}
    started, answered = threading.Event(), threading.Event()

    def side():
        seen["thread"] = threading.current_thread()
        seen["group"], seen["wait"] = epl._LANE.group, epl._LANE.wait
        seen["grad"] = torch.is_grad_enabled()
        started.set()
        # the other op must be running now: one after the other, this would time out
        seen["met"] = answered.wait(timeout=60)

    def here():
        assert started.wait(timeout=60), "the lane did not start beside this thread"
        seen["here_group"] = epl._LANE.group
        answered.set()

    with torch.no_grad():
        lane.run(0, [], side, here, wait)
    assert seen["met"] and seen["thread"] is not threading.current_thread()
    assert seen["group"] is GROUP and seen["wait"] is wait and seen["here_group"] is None
    assert seen["grad"] is False  # this thread's mode, not a new thread's default
    assert epl._LANE.group is None


def test_an_error_in_the_lane_comes_out_as_itself():
    error = PlanLaunchError("plan.octo: a one-line error")

    def side():
        raise error

    with pytest.raises(PlanLaunchError) as e:
        Lane(GROUP, CPU, [0]).run(0, [], side, lambda: None, wait)
    assert e.value is error


def test_an_error_here_is_raised_without_waiting_for_a_stuck_lane():
    stuck = threading.Event()

    def here():
        raise ValueError("here")

    with pytest.raises(ValueError, match="here"):
        # the lane waits for what never comes (a dead peer: the watchdog would end it)
        Lane(GROUP, CPU, [0]).run(0, [], lambda: stuck.wait(), here, wait)
    stuck.set()
