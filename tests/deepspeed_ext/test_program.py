"""Plan -> per-rank instructions, checked without processes: every rank's program, run together
with non-blocking sends, completes, and every stream's messages are sent in the order its
receiver posts them."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")

from octodsl.deepspeed_ext.errors import PlanLaunchError  # noqa: E402
from octodsl.deepspeed_ext.lanes import in_turn_note, in_turn_reason  # noqa: E402
from octodsl.deepspeed_ext.launch import check_launch  # noqa: E402
from octodsl.deepspeed_ext.partition import stage_layers  # noqa: E402
from octodsl.deepspeed_ext.program import (  # noqa: E402
    LoadMicroBatch,
    PlanSchedule,
    PostRecvs,
    Recv,
    RunGroup,
    RunOp,
    Send,
    forward_only,
)
from octodsl.gen import SCHEDULES, generate  # noqa: E402
from octodsl.lang import parse_plan  # noqa: E402
from octodsl.plan import Op, OpKind, Recompute  # noqa: E402

IRREGULAR = """
plan "irregular" { devices 3 microbatches 2 }
partition { stage 0: layers 0..1  stage 1: layers 2..3  stage 2: layers 4..5  stage 3: layers 6..7 }
placement { device 0: stages 0, 3  device 1: stages 2  device 2: stages 1 }
schedule {
  device 0 { F0:0 F0:1 F3:0 B3:0 F3:1 B3:1 BW0:0 BW0:1 W3:1 W3:0 }
  device 1 { F2:0 F2:1 B2:0 B2:1 W2:0 W2:1 }
  device 2 { F1:0 F1:1 BW1:0 BW1:1 }
}
"""


def run_all(plan, train=True, at_once=lambda ops: False) -> dict[int, list]:
    """Run every rank's program; a Recv waits until its message was sent. Returns, per rank,
    the ops in the order run; fails on a deadlock or a send out of stream order."""
    progs = {
        d: [c for step in PlanSchedule(plan, d, train, at_once) for c in step]
        for d in range(plan.devices)
    }
    sent: set[int] = set()
    last_sent: dict[tuple[int, int], int] = {}
    posted: dict[int, int] = {}
    pos = {d: 0 for d in progs}
    ran = {d: [] for d in progs}
    while any(pos[d] < len(progs[d]) for d in progs):
        moved = False
        for d, prog in progs.items():
            while pos[d] < len(prog):
                cmd = prog[pos[d]]
                if isinstance(cmd, Recv):
                    if cmd.msg.id not in sent:
                        break
                    assert cmd.msg.id in posted, "a receive is waited on before it is posted"
                elif isinstance(cmd, PostRecvs):
                    for i in cmd.ids:
                        posted.setdefault(i, pos[d])
                elif isinstance(cmd, Send):
                    stream = (cmd.msg.src, cmd.msg.dst)
                    assert last_sent.get(stream, -1) < cmd.msg.id, "sent out of stream order"
                    last_sent[stream] = cmd.msg.id
                    sent.add(cmd.msg.id)
                elif isinstance(cmd, RunOp):
                    ran[d].append(cmd.op)
                elif isinstance(cmd, RunGroup):
                    ran[d].extend(cmd.ops)
                pos[d] += 1
                moved = True
        assert moved, (
            f"deadlock: {[(d, progs[d][pos[d]]) for d in progs if pos[d] < len(progs[d])]}"
        )
    return ran


def plans():
    for name in SCHEDULES:
        for devices, mbs in ((2, 4), (3, 6), (4, 8)):
            yield f"{name}-p{devices}-m{mbs}", generate(name, devices=devices, microbatches=mbs)
    yield "irregular", parse_plan(IRREGULAR)


@pytest.mark.parametrize("name,plan", list(plans()), ids=lambda x: x if isinstance(x, str) else "")
def test_programs_complete_in_stream_order(name, plan):
    ran = run_all(plan)
    assert ran == {
        d: [op for slot in plan.schedule[d] for op in slot.ops] for d in range(plan.devices)
    }
    forward = run_all(plan, train=False)
    assert all(op.kind is OpKind.F for ops in forward.values() for op in ops)


@pytest.mark.parametrize("devices,mbs", [(2, 4), (3, 6), (4, 8)])
def test_groups_run_at_once_complete_in_stream_order(devices, mbs):
    plan = generate("dualpipev", devices=devices, microbatches=mbs)
    assert run_all(plan, at_once=lambda ops: True) == run_all(plan)
    steps = [step for step in PlanSchedule(plan, 0, True, lambda ops: True)]
    grouped = [step for step in steps if any(isinstance(c, RunGroup) for c in step)]
    assert len(grouped) == sum(slot.overlapped for slot in plan.schedule[0]) > 0
    for step in grouped:  # one RunGroup: its micro-batches drawn before it, its results sent after
        kinds = [type(c) for c in step]
        assert RunOp not in kinds and kinds.count(RunGroup) == 1
        i = kinds.index(RunGroup)
        assert all(k is not Send for k in kinds[:i]) and all(k is Send for k in kinds[i + 1 :])
        assert {c.msg.producer for c in step[i + 1 :]} <= set(step[i].ops)
    assert not any(isinstance(c, RunGroup) for step in PlanSchedule(plan, 0, False) for c in step)


def test_which_groups_run_at_once():
    f, bw, b, w = Op(OpKind.F, 0, 3), Op(OpKind.BW, 3, 1), Op(OpKind.B, 3, 1), Op(OpKind.W, 3, 1)
    none = [Recompute.NONE] * 4
    assert all(in_turn_reason(ops, none, 2, 1) is None for ops in ((f, bw), (bw, f), (b, f)))
    assert in_turn_reason((f, Op(OpKind.BW, 0, 1)), none, 2, 1) is None  # the same stage
    assert in_turn_reason((f, w), none, 2, 1) is None
    assert in_turn_reason((f, bw), none, 1, 1) == "ep 1: no expert all-to-alls to hide"
    assert "tp collectives" in in_turn_reason((f, bw), none, 2, 2)
    for ops in ((f, Op(OpKind.F, 3, 1)), (bw, w), (f, bw, w)):
        assert "does not pair one forward with one backward" in in_turn_reason(ops, none, 2, 1)
    full = [Recompute.NONE, Recompute.NONE, Recompute.NONE, Recompute.FULL]
    assert in_turn_reason((f, bw), full, 2, 1) == (
        "stage 3 recomputes (recompute's scope is process-wide)"
    )


def test_a_group_in_turn_is_named_with_the_reason_at_ep_above_1():
    f, bw, f2 = Op(OpKind.F, 0, 3), Op(OpKind.BW, 3, 1), Op(OpKind.F, 3, 2)
    none = [Recompute.NONE] * 4
    assert in_turn_note(0, [(f, bw)], none, 2, 1) is None
    assert in_turn_note(0, [(f, f2)], none, 1, 1) is None  # ep 1: in turn by design, unsaid
    assert in_turn_note(0, [(f, bw), (f, f2), (f2, bw, f)], none, 2, 1) == (
        "octodsl: device 0: overlap group (F0:3 & F3:2) runs its ops in turn: it does not pair "
        "one forward with one backward (two forwards share the module's active stage; two "
        "backwards add into the same gradients) (and 1 more)"
    )


def test_messages_follow_the_dag():
    plan = parse_plan(IRREGULAR)
    sched = PlanSchedule(plan, 0, True)
    got = {(str(m.producer), str(m.consumer), m.src, m.dst) for m in sched.messages}
    # stage 0 (device 0) -> 1 (device 2) -> 2 (device 1) -> 3 (device 0) and gradients back
    assert ("F0:0", "F1:0", 0, 2) in got and ("F2:1", "F3:1", 1, 0) in got
    assert ("B3:0", "B2:0", 0, 1) in got and ("BW1:1", "BW0:1", 2, 0) in got
    assert not any(p.startswith("W") or c.startswith("W") for p, c, _, _ in got)
    assert len(got) == 2 * 3 * 2  # 3 boundaries, 2 micro-batches, both directions


def test_loads_come_in_micro_batch_order_before_the_forwards():
    plan = generate("zb-v", devices=2, microbatches=4)
    cmds = [c for step in PlanSchedule(plan, 0, True) for c in step]
    loads = [c.mb for c in cmds if isinstance(c, LoadMicroBatch)]
    assert loads == [0, 1, 2, 3]  # device 0 holds stage 0 and the loss stage: one draw each
    first_f0 = next(i for i, c in enumerate(cmds) if isinstance(c, RunOp) and str(c.op) == "F0:0")
    assert isinstance(cmds[first_f0 - 1], LoadMicroBatch)
    assert not any(
        isinstance(c, LoadMicroBatch) for step in PlanSchedule(plan, 1, True) for c in step
    )


def test_forward_only_keeps_forwards_in_order():
    plan = generate("dualpipev", devices=2, microbatches=4)
    fwd = forward_only(plan)
    for d in range(2):
        assert [str(op) for s in fwd.schedule[d] for op in s.ops] == [
            str(op) for s in plan.schedule[d] for op in s.ops if op.kind is OpKind.F
        ]


def _with_layers(plan, bounds):
    from octodsl.plan import Plan, Stage

    # strict=False: consecutive pairs, bounds[1:] is one shorter
    return Plan(
        plan.header,
        [Stage(a, b - 1) for a, b in zip(bounds, bounds[1:], strict=False)],
        plan.placement,
        plan.schedule,
    )


CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4}


def test_check_launch_accepts_a_fitting_plan():
    plan = _with_layers(generate("1f1b", devices=2, microbatches=4), [0, 5, 10])
    assert check_launch(plan, 2, CONFIG, 10) == [range(0, 5), range(5, 10)]


@pytest.mark.parametrize(
    "world,config,layers,message",
    [
        (
            4,
            CONFIG,
            10,
            "1 data-parallel copy of a 2-device pipeline (2 processes), but the job has "
            "4 processes; to fit it set `dp 2` or `tp 2` in the plan header",
        ),
        (
            2,
            {**CONFIG, "gradient_accumulation_steps": 8},
            10,
            "4 micro-batches per step, but the DeepSpeed config gives 8 gradient-accumulation steps",
        ),
        (2, {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2}, 10, "gives 8 gradient"),
        (2, CONFIG, 12, "covers 10 layers (0..9), but the model has 12 (0..11)"),
    ],
)
def test_check_launch_rejects_a_mismatch(world, config, layers, message):
    plan = _with_layers(generate("1f1b", devices=2, microbatches=4), [0, 5, 10])
    with pytest.raises(PlanLaunchError, match=None) as e:
        check_launch(plan, world, config, layers)
    assert message in str(e.value)


def test_check_launch_rejects_a_plan_with_lint_errors():
    bad = parse_plan(IRREGULAR.replace("BW1:1 }", "}"))  # a missing backward
    with pytest.raises(PlanLaunchError, match="does not lint clean"):
        check_launch(bad, 3, {"gradient_accumulation_steps": 2}, 8)


def test_check_launch_rejects_an_idle_device():
    idle = IRREGULAR.replace("devices 3", "devices 4").replace(
        "device 2 { F1:0 F1:1 BW1:0 BW1:1 }", "device 2 { F1:0 F1:1 BW1:0 BW1:1 }\n  device 3 { }"
    )
    with pytest.raises(PlanLaunchError, match="device.s. 3 hold no stage"):
        check_launch(parse_plan(idle), 4, {"gradient_accumulation_steps": 2}, 8)


def test_abstract_plan_is_split_by_cost():
    plan = generate("1f1b", devices=2, microbatches=4)
    with pytest.raises(PlanLaunchError, match="give a model"):
        stage_layers(plan, 6)
    assert stage_layers(plan, 6, [1, 1, 1, 1, 4, 1]) == [range(0, 4), range(4, 6)]
