"""A profile file whose numbers are not finite, negative or absurd is refused with a message
naming the file and the field (the simulator would otherwise print "efficiency nan%")."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from octodsl.cli import main
from octodsl.costs.profile import ProfileError, read_profile

from ..calibrate import synthetic as syn

GOOD = json.loads(syn.profile(syn.TRUE).model_dump_json())


def _numbers(obj, path=()):
    """(path, value) of every number in the profile's JSON, the model spec's left out (it is
    the model's own validation)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if path == () and k == "model":
                continue
            yield from _numbers(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, path + (i,))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool) and path[-2:-1] != ("fit",):
        yield path, obj


NUMBERS = [p for p, _ in _numbers(GOOD) if "fit" not in p and "processes" not in p]


def _set(data, path, value):
    for k in path[:-1]:
        data = data[k]
    data[path[-1]] = value


SECONDS_AND_BYTES = [
    p
    for p in NUMBERS
    if p[-1] in ("f", "b", "w", "act", "act_w", "out_bytes", "latency", "step_overhead")
    or (len(p) > 1 and ("samples" in str(p[-2]) or p[-2] in ("op_overhead", "act_w_extra")))
]


def _refused(tmp_path, path, value):
    data = json.loads(json.dumps(GOOD))
    _set(data, path, value)
    file = tmp_path / "bad.profile.json"
    file.write_text(json.dumps(data))  # Python writes nan and inf as NaN and Infinity
    where = ".".join(map(str, path))
    with pytest.raises(ProfileError, match=rf"^{file}: not a valid profile \({where}: "):
        read_profile(file)


# the examples share tmp_path: each writes its one file anew
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(NUMBERS), st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e-9]))
def test_bad_numbers_are_refused_naming_the_field(tmp_path, path, value):
    _refused(tmp_path, path, value)


# the examples share tmp_path: each writes its one file anew
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(SECONDS_AND_BYTES), st.floats(min_value=1.2e15, allow_infinity=False))
def test_absurd_seconds_and_bytes_are_refused(tmp_path, path, value):
    _refused(tmp_path, path, value)


@pytest.mark.parametrize(
    "path, value",
    [(("calibration", "link", "bandwidth"), 1e-300), (("calibration", "cores"), 1e-9)],
)
def test_values_that_would_make_times_infinite_are_refused(tmp_path, path, value):
    _refused(tmp_path, path, value)


def test_a_good_profile_reads(tmp_path):
    file = tmp_path / "good.profile.json"
    file.write_text(json.dumps(GOOD))
    assert read_profile(file).calibration.cores == 2.0


def test_simulate_refuses_a_nan_profile(tmp_path, capsys):
    data = json.loads(json.dumps(GOOD))
    data["layers"][1]["f"] = math.nan
    file = tmp_path / "nan.profile.json"
    file.write_text(json.dumps(data))
    plan = tmp_path / "p.octo"
    from octodsl.gen import render_plan

    plan.write_text(render_plan(syn.plan("1f1b", 2, 4, tmp_path)))
    assert main(["simulate", str(plan), "--profile", str(file)]) == 2
    assert "layers.1.f: Input should be a finite number" in capsys.readouterr().err


def test_simulate_refuses_a_profile_of_another_shape(tmp_path, capsys):
    file = syn.write_profile_file(tmp_path / "p.profile.json")
    plan = tmp_path / "p.octo"
    from octodsl.gen import render_plan

    text = render_plan(syn.plan("1f1b", 2, 4, tmp_path))
    plan.write_text(text.replace("  microbatches 4\n", "  microbatches 4\n  seq_len 99\n"))
    assert main(["simulate", str(plan), "--profile", str(file)]) == 2
    err = capsys.readouterr().err
    assert "was measured at sequence length" in err and "asks for 99" in err
