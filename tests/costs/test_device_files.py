"""Device and link files (octodsl.costs.device_file): accepted wherever a built-in's name is,
equal to a built-in when they say the same, and every bad file refused with one message that
names the file and the field."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from octodsl.costs import device_file as df
from octodsl.costs.device_file import DeviceFileError, LinkFile, load_device, load_link
from octodsl.costs.devices import (
    CUBLAS_TILES,
    DEVICES,
    LINKS,
    CommSms,
    Overheads,
    _tensor_core_gemm,
    get_device,
    get_link,
)
from octodsl.costs.gemm import GemmModel, Tile
from octodsl.costs.resolve import cost_table
from octodsl.costs.table import Link
from octodsl.costs.work import Gemm
from octodsl.errors import OctoError

from ..conftest import REPO

GPU = {
    "name": "MyGPU",
    "peak_flops": 1e15,
    "fp32_flops": 5e14,
    "vector_flops": 6e13,
    "mem_bandwidth": 3e12,
    "memory": "80GB",
    "gemm": {"sms": 132, "mamf": 0.8, "shape": [2048, 2048, 13312]},
}
"""A complete device file's mapping (the optional fields left out)."""


def _write(tmp_path, data: dict, name: str = "gpu.yaml") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return str(path)


def _with(**changes) -> dict:
    """GPU with fields replaced (a value of None removes the field); `gemm__sms` is a field of
    gemm."""
    data = json.loads(json.dumps(GPU))
    for key, value in changes.items():
        *parents, leaf = key.split("__")
        target = data
        for p in parents:
            target = target.setdefault(p, {})
        if value is None:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return data


# --- Built-ins as files -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DEVICES))
def test_every_builtin_device_round_trips_through_a_file(tmp_path, name):
    builtin = DEVICES[name]
    yaml_path = tmp_path / f"{name}.yaml"
    yaml_path.write_text(df.to_yaml(df.device_data(builtin), name))
    assert load_device(yaml_path) == builtin
    json_path = tmp_path / f"{name}.json"
    json_path.write_text(
        json.dumps({"octodsl_version": "0.0.0", **df.json_ready(df.device_data(builtin))})
    )
    assert load_device(json_path) == builtin


@pytest.mark.parametrize("name", list(LINKS))
def test_every_builtin_link_round_trips_through_a_file(tmp_path, name):
    path = tmp_path / f"{name}.yaml"
    path.write_text(df.to_yaml(df.link_data(LINKS[name]), name))
    link = load_link(path)
    assert link == LINKS[name] and link.source == LINKS[name].source


def test_a_builtin_gpu_file_names_its_gemm_measurement():
    data = df.device_data(DEVICES["A100"])
    assert data["gemm"] == {"sms": 108, "mamf": 0.869, "shape": [1024, 10240, 5120]}
    assert "backward" not in data["attention"]  # A100's curves are forward + backward together
    assert df.device_data(DEVICES["cpu"])["gemm"] == {"peak_fraction": 0.75}


def test_every_builtin_has_a_source():
    assert all(d.source for d in DEVICES.values())
    assert all(link.source for link in LINKS.values())
    # the source is what the figures rest on, not what the link is
    assert Link("nvlink", 8e-6, 160e9) == LINKS["nvlink"]


def test_a_device_file_gives_the_builtins_cost_table(tmp_path):
    path = tmp_path / "h800.yaml"
    path.write_text(df.to_yaml(df.device_data(DEVICES["H800"]), "H800"))
    mine = cost_table(model="nemotron-h-tiny", device=str(path), tp=2)
    theirs = cost_table(model="nemotron-h-tiny", device="H800", tp=2)
    assert mine.layers == theirs.layers and mine.source == theirs.source
    # the meta keeps what resolves to the device again: the file's path
    assert mine.meta["device"] == str(path) and theirs.meta["device"] == "H800"
    assert get_device(mine.meta["device"]) == DEVICES["H800"]
    assert {k: v for k, v in mine.meta.items() if k != "device"} == {
        k: v for k, v in theirs.meta.items() if k != "device"
    }


# --- What a file can say ------------------------------------------------------------------


def test_numbers_as_numbers_or_numeric_text(tmp_path):
    forms = [24e9, "24e9", 24_000_000_000, "2.4e+10", " 24000000000.0 "]
    got = {
        load_device(_write(tmp_path, _with(vector_flops=v), f"g{i}.yaml")).vector_flops
        for i, v in enumerate(forms)
    }
    assert got == {24e9}
    # PyYAML reads 24e9 (no point, no exponent sign) as text: accepted all the same
    (tmp_path / "plain.yaml").write_text(
        yaml.safe_dump(_with(vector_flops=None)) + "vector_flops: 24e9\n"
    )
    assert load_device(tmp_path / "plain.yaml").vector_flops == 24e9


@pytest.mark.parametrize(
    "memory,nbytes",
    [
        ("80GB", 80 * 10**9),
        ("80GiB", 80 * 2**30),
        (80 * 10**9, 80 * 10**9),
        ("8e10", 8 * 10**10),
        ("1024", 1024),
    ],
)
def test_memory_as_a_size_or_bytes(tmp_path, memory, nbytes):
    assert load_device(_write(tmp_path, _with(memory=memory))).memory == nbytes


def test_the_gemm_model_as_a_measurement_or_as_itself(tmp_path):
    calibrated = load_device(_write(tmp_path, GPU, "a.yaml"))
    assert calibrated.gemm == _tensor_core_gemm(0.8, (2048, 2048, 13312), 132, 1e15, 0.8 * 3e12)
    assert calibrated.gemm.tiles == CUBLAS_TILES and calibrated.gemm.k_ramp > 0
    explicit = load_device(
        _write(tmp_path, _with(gemm={"sms": 100, "peak_fraction": 0.9}), "b.yaml")
    )
    assert explicit.gemm == GemmModel(0.9, 100, CUBLAS_TILES)
    tiles = load_device(
        _write(
            tmp_path,
            _with(
                gemm={
                    "sms": 100,
                    "peak_fraction": 0.9,
                    "tiles": [[128, 128], [64, 64, 0.5]],
                    "k_ramp": 32,
                    "ceiling": 0.8,
                }
            ),
            "c.yaml",
        )
    )
    assert tiles.gemm == GemmModel(0.9, 100, (Tile(128, 128), Tile(64, 64, 0.5)), 32.0, 0.8)
    # no shape beats the ceiling: the largest GEMM's tiles would reach 0.9 of the peak
    assert tiles.gemm.efficiency(Gemm(16384, 16384, 16384), 1e15, 3e12, 2) == pytest.approx(0.8)
    cpu = load_device(_write(tmp_path, _with(gemm={"peak_fraction": 0.75}), "d.yaml"))
    assert cpu.gemm == GemmModel(0.75)


def test_attention_curves_and_efficiency(tmp_path):
    curve = {"seq": [512, 4096], "tflops": ["100", 200]}
    d = load_device(
        _write(
            tmp_path,
            _with(attention={"forward": {64: curve, "128": curve}}, efficiency={"scan": 0.3}),
        )
    )
    assert [c.head_dim for c in d.attention.forward] == [64, 128]
    assert d.attention.backward == d.attention.forward  # not given: the forward's
    assert d.attention.rates(512, 64) == (100e12, 100e12)
    assert d.efficiency.scan == 0.3 and d.efficiency.bandwidth == 0.8  # the rest: defaults


def test_overheads_default_to_the_devices(tmp_path):
    assert load_device(_write(tmp_path, GPU, "a.yaml")).overheads == DEVICES["H800"].overheads
    none = load_device(
        _write(
            tmp_path,
            _with(
                overheads={
                    "f_seconds": 0,
                    "b_seconds": "0",
                    "f_bytes": 0,
                    "b_bytes": 0,
                    "message_seconds": 0,
                }
            ),
            "b.yaml",
        )
    )
    assert none.overheads == DEVICES["cpu"].overheads == Overheads()


def test_comm_sms_default_to_a_dgx_a100s_share_of_the_sms(tmp_path):
    """Left out: tp and dp_node as a DGX A100's share of the file's SMs (16 and 24 of 108),
    the ring's channels per GPU across nodes and their cap as a DGX A100's; a CPU (no SMs)
    loses none to a collective."""
    d = load_device(_write(tmp_path, GPU, "a.yaml"))
    assert d.comm_sms == CommSms(round(16 * 132 / 108), round(24 * 132 / 108), 2, 32)
    assert d.comm_sms.dp(8, True) == 16 and d.comm_sms.dp(1, True) == 2
    assert d.comm_sms.dp(8, False) == d.comm_sms.dp_node
    given = load_device(
        _write(tmp_path, _with(comm_sms={"tp": 8, "dp_per_gpu": 4, "dp_max": 16}), "b.yaml")
    )
    assert given.comm_sms == CommSms(8, round(24 * 132 / 108), 4, 16)
    assert given.comm_sms.dp(8, True) == 16 and given.overlap_slowdown(16) == 16 / 132
    cpu = load_device(_write(tmp_path, _with(gemm={"peak_fraction": 0.7}), "c.yaml"))
    assert cpu.comm_sms == CommSms() and cpu.overlap_slowdown(16) == 0.0
    # a tiny GPU's defaults leave its compute some SMs
    tiny = load_device(_write(tmp_path, _with(gemm={"sms": 4, "peak_fraction": 0.7}), "d.yaml"))
    assert max(tiny.comm_sms.tp, tiny.comm_sms.dp_node, tiny.comm_sms.dp_max) <= 3


def test_a_device_files_own_links(tmp_path):
    data = _with(
        node_link={"name": "my-nvlink", "latency": 5e-6, "bandwidth": "3e11"},
        inter_node_link="IB-HDR",
    )
    d = load_device(_write(tmp_path, data))
    assert d.node_link == Link("my-nvlink", 5e-6, 3e11) and d.inter_node_link == "ib-hdr"
    assert get_link(d.node_link) is d.node_link
    # the tp collectives run on the device's own node link
    table = cost_table(model="nemotron-h-tiny", device=_write(tmp_path, data, "g.json"), tp=2)
    assert "on my-nvlink" in table.source


def test_names_and_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu").write_text("not a device file")
    assert get_device("cpu") is DEVICES["cpu"]  # a built-in's name first
    assert get_device("H800") is get_device("h800")
    (tmp_path / "mygpu").write_text(yaml.safe_dump(GPU))  # an existing file, any suffix
    assert get_device("mygpu").name == "MyGPU"
    with pytest.raises(OctoError, match="unknown device 'tpu'.*or a device file"):
        get_device("tpu")
    with pytest.raises(OctoError, match="unknown link 'ethernet'.*or a link file"):
        get_link("ethernet")


def test_a_file_is_read_once_while_it_is_unchanged(tmp_path):
    path = _write(tmp_path, GPU)
    first = load_device(path)
    assert load_device(path) is first
    assert get_device(str(tmp_path / "." / "gpu.yaml")) is first  # the same file, resolved
    _write(tmp_path, _with(name="Changed"))
    stamp = os.stat(path).st_mtime_ns + 10**9
    os.utime(path, ns=(stamp, stamp))
    assert load_device(path).name == "Changed"


# --- Bad files ----------------------------------------------------------------------------

BAD_VALUES = [
    ({"peak_flops": -1e15}, "peak_flops: must be at least 1e+06 FLOP/s"),
    ({"peak_flops": 0}, "peak_flops: must be at least"),
    ({"peak_flops": float("nan")}, "peak_flops: must be a finite number"),
    ({"peak_flops": float("inf")}, "peak_flops: must be a finite number"),
    ({"peak_flops": "1e400"}, "peak_flops: must be a finite number"),
    ({"peak_flops": "nan"}, "peak_flops: 'nan' is not a number"),
    ({"peak_flops": 1e19}, "peak_flops: must be at most 1e+18 FLOP/s"),
    ({"peak_flops": 10**400}, "peak_flops: must be at most 1e+18 FLOP/s"),
    ({"peak_flops": "fast"}, "peak_flops: 'fast' is not a number"),
    ({"peak_flops": True}, "peak_flops: must be a number, not true"),
    ({"peak_flops": [1e15]}, "peak_flops: must be a number, not a list"),
    ({"mem_bandwidth": 2e15}, "mem_bandwidth: must be at most 1e+15 bytes/s"),
    ({"memory": "80 parsecs"}, "memory: cannot read '80 parsecs' as a size"),
    ({"memory": 0}, "memory: must be at least 1 byte"),
    ({"memory": "2048TiB"}, "memory: must be at most 1024TiB"),
    ({"memory": 1.5}, "memory: must be a whole number of bytes"),
    ({"name": 4090}, "name: must be text, not int (quote it)"),
    ({"name": ""}, "name: must not be empty"),
    ({"name": "x" * 65}, "name: must be at most 64 characters"),
    ({"name": "a\x1bb"}, "name: must not hold control characters"),
    ({"peak_flop": 1e15}, "unknown field 'peak_flop' (did you mean 'peak_flops'?)"),
    ({"peak_flops": None}, "peak_flops: missing (a required field)"),
    ({"gemm": None}, "gemm: missing (a required field)"),
    ({"gemm__sms": 0}, "gemm.sms: must be at least 1"),
    ({"gemm__sms": 13.5}, "gemm.sms: must be a whole number, not 13.5"),
    ({"gemm__smss": 132}, "gemm: unknown field 'smss' (did you mean 'sms'?)"),
    ({"gemm": [132]}, "gemm: must be a mapping of fields, not a list"),
    ({"gemm__mamf": 1.5}, "gemm.mamf: must be at most 1"),
    ({"gemm__shape": [2048, 2048]}, "gemm.shape: a GEMM shape is [m, n, k], not a list of 2"),
    ({"gemm__shape": [2048, 0, 1]}, "gemm.shape: n: must be at least 1"),
    ({"gemm__shape": None}, "gemm: mamf needs the shape it was measured at"),
    ({"gemm__peak_fraction": 0.8}, "gemm: give peak_fraction or mamf, not both"),
    ({"gemm__tiles": [[128, 128]]}, "gemm: mamf calibrates cuBLAS's tiles"),
    ({"gemm__ceiling": 0.7}, "gemm: mamf calibrates cuBLAS's tiles, their ramp and the ceiling"),
    (
        {"gemm": {"sms": 100, "peak_fraction": 0.9, "ceiling": 0}},
        "gemm.ceiling: must be at least 0.001",
    ),
    ({"gemm__shape": [64, 64, 64]}, "gemm.mamf: 0.8 at 64x64x64 would need a mainloop"),
    ({"gemm": {"peak_fraction": 0.8, "tiles": [[128, 128]]}}, "gemm: tiles and k_ramp need sms"),
    (
        {"gemm": {"sms": 10, "peak_fraction": 0.8, "tiles": [[128, 128, 2]]}},
        "gemm.tiles.0: rate: must be at most 1",
    ),
    (
        {"gemm": {"sms": 10, "peak_fraction": 0.8, "tiles": [128]}},
        "gemm.tiles.0: a tile is [rows, cols] or [rows, cols, rate], not int",
    ),
    ({"gemm": {"sms": 10}}, "gemm: give peak_fraction, or mamf and the shape"),
    (
        {"attention": {"forward": {64: {"seq": [512, 1024], "tflops": [100]}}}},
        "attention.forward.64: seq has 2 lengths and tflops 1 rates: give one rate per length",
    ),
    (
        {"attention": {"forward": {64: {"seq": [1024, 512], "tflops": [100, 200]}}}},
        "attention.forward.64.seq: must be strictly increasing (512 follows 1,024)",
    ),
    (
        {"attention": {"forward": {64: {"seq": [512, 512], "tflops": [100, 200]}}}},
        "attention.forward.64.seq: must be strictly increasing",
    ),
    (
        {"attention": {"forward": {0: {"seq": [512], "tflops": [100]}}}},
        "attention.forward.0.[key]: must be at least 1",
    ),
    ({"attention": {"forward": {}}}, "attention.forward: "),
    (
        {"attention": {"forward": {64: {"seq": [512], "tflops": [-1]}}}},
        "attention.forward.64.tflops.0: must be at least 1e-06 TFLOP/s",
    ),
    ({"efficiency": {"scan": 0}}, "efficiency.scan: must be at least 0.001"),
    (
        {"comm_sms": {"tp": 132}},
        "comm_sms.tp: 132 of the 132 SMs (gemm.sms) would leave the compute under the "
        "collective none: give fewer",
    ),
    ({"comm_sms": {"dp_max": 500}}, "comm_sms.dp_max: 500 of the 132 SMs"),
    ({"comm_sms": {"dp_node": -1}}, "comm_sms.dp_node: must be at least 0"),
    ({"comm_sms": {"dp_per_gpu": 2.5}}, "comm_sms.dp_per_gpu: must be a whole number"),
    ({"comm_sms": {"dp": 8}}, "comm_sms: unknown field 'dp' (known: tp, dp_node"),
    ({"overheads": {"f_seconds": -1e-4}}, "overheads.f_seconds: must be at least 0 s"),
    ({"overheads": {"b_bytes": 1e7}}, "overheads.b_bytes: must be at most 1e+06 bytes"),
    (
        {"efficiency": {"bandwith": 0.5}},
        "efficiency: unknown field 'bandwith' (did you mean 'bandwidth'?)",
    ),
    ({"node_link": "ethernet"}, "node_link: unknown link 'ethernet' (built-ins: nvlink"),
    ({"node_link": 5}, "node_link: must be a built-in link's name or a mapping"),
    ({"node_link": {"name": "x", "latency": 1e-5}}, "node_link.bandwidth: missing"),
    (
        {"inter_node_link": {"name": "x", "latency": 2, "bandwidth": 1e9}},
        "inter_node_link.latency: must be at most 1 s",
    ),
]


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("changes,message", BAD_VALUES, ids=[m for _, m in BAD_VALUES])
def test_bad_values_are_refused_naming_the_file_and_the_field(tmp_path, changes, message, suffix):
    if suffix == ".json" and (
        any(k == "name" and v == 4090 for k, v in changes.items())
        or any(isinstance(v, dict) and 0 in v.get("forward", {}) for v in changes.values())
    ):
        pytest.skip("JSON keys are text")
    data = _with(**changes)
    if suffix == ".json":
        text = json.dumps(data)  # NaN, Infinity: what Python's json writes and reads
    else:
        text = yaml.safe_dump(data)
    path = tmp_path / f"gpu{suffix}"
    path.write_text(text)
    with pytest.raises(DeviceFileError) as e:
        load_device(path)
    assert str(e.value).startswith(f"{path}: {message}"), str(e.value)
    assert "\n" not in str(e.value) and e.value.path == str(path)


BAD_FILES = [
    (b"- a\n- b\n", "a device file is a mapping of fields, not a list"),
    (b"just text\n", "a device file is a mapping of fields, not text"),
    (b"", "is empty"),
    (b"# a comment\n", "holds no fields; a device file is a mapping of fields"),
    (b"name: \xff\xfe\n", "not UTF-8 text (byte 6 is 0xff)"),
    (b"name: [unclosed\n", "not valid YAML: expected ',' or ']'"),
    (b"a: " + b"[" * 50_000, "not valid YAML: nested too deep"),
    (b"peak_flops: " + b"9" * 5000 + b"\n", "not valid YAML: a number of 4,300 digits or more"),
    (b"\t- tab", "not valid YAML"),
]


@pytest.mark.parametrize("content,message", BAD_FILES, ids=[m for _, m in BAD_FILES])
def test_bad_files_are_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "gpu.yaml"
    path.write_bytes(content)
    with pytest.raises(DeviceFileError) as e:
        load_device(path)
    assert str(e.value).startswith(f"{path}: {message}"), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "content,message",
    [
        (b'{"name": ', "not valid JSON: Expecting value at line 1, column 10"),
        (b"[" * 100_000, "not valid JSON: nested too deep"),
        (
            b'{"peak_flops": ' + b"9" * 5000 + b"}",
            "not valid JSON: a number of 4,300 digits or more",
        ),
        (b"[1, 2]", "a device file is a mapping of fields, not a list"),
    ],
)
def test_bad_json_files(tmp_path, content, message):
    path = tmp_path / "gpu.json"
    path.write_bytes(content)
    with pytest.raises(
        DeviceFileError,
        match="^"
        + str(path).replace(".", r"\.")
        + ": "
        + message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)"),
    ):
        load_device(path)


def test_missing_folder_and_huge_files(tmp_path):
    with pytest.raises(DeviceFileError, match=r"gone\.yaml: no such device file$"):
        get_device(str(tmp_path / "gone.yaml"))
    with pytest.raises(DeviceFileError, match=r"gone\.json: no such link file$"):
        get_link(str(tmp_path / "gone.json"))
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(DeviceFileError, match=r"folder\.yaml: is a folder, not a device file"):
        get_device(str(folder))
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * (2 << 20))
    with pytest.raises(
        DeviceFileError,
        match=r"huge\.yaml: is 2,097,154 bytes; a device file "
        r"is at most 1MiB",
    ):
        get_device(str(huge))


BAD_LINKS = [
    ({"latency": -1}, "latency: must be at least 0 s"),
    ({"latency": "1e400"}, "latency: must be a finite number"),
    ({"bandwidth": 1e16}, "bandwidth: must be at most 1e+15 bytes/s"),
    ({"bandwidth": 10}, "bandwidth: must be at least 1e+06 bytes/s (or 0)"),
    ({"bandwidth": 0}, "bandwidth 0 means free communication: give latency 0 with it"),
    ({"name": None}, "name: missing (a required field)"),
    ({"bandwith": 1e9}, "unknown field 'bandwith' (did you mean 'bandwidth'?)"),
    ({"peak_flops": 1e15}, "unknown field 'peak_flops' (known: name, latency, bandwidth"),
]


@pytest.mark.parametrize("changes,message", BAD_LINKS, ids=[m for _, m in BAD_LINKS])
def test_bad_link_files(tmp_path, changes, message):
    data = {"name": "roce", "latency": 1e-5, "bandwidth": 25e9, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    path = _write(tmp_path, data, "link.yaml")
    with pytest.raises(DeviceFileError) as e:
        get_link(path)
    assert str(e.value).startswith(f"{path}: {message}"), str(e.value)


def test_a_free_link_file(tmp_path):
    assert (
        get_link(
            _write(tmp_path, {"name": "free", "latency": 0, "bandwidth": 0}, "free.yaml")
        ).time(1e9)
        == 0
    )


# --- The number validation, as a property -------------------------------------------------

NUMBERISH = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda x: f"{x:e}"),
    st.text(max_size=20),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)


def _as_number(value) -> float | None:
    """What the file's number means, or None where it must be refused."""
    if isinstance(value, bool) or value is None or isinstance(value, list):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not df._NUMBER.fullmatch(text) or len(text) > 64:
            return None
        value = float(text)
    return float(value) if math.isfinite(value) else None


@given(NUMBERISH)
@example(math.nan)  # one draw in hundreds: the fixed examples the profile draws have none
def test_a_latency_is_accepted_exactly_when_it_is_a_finite_number_in_range(value):
    number = _as_number(value)
    ok = number is not None and 0 <= number <= df.MAX_LATENCY
    try:
        link = LinkFile.model_validate({"name": "l", "latency": value, "bandwidth": 1e9}).link()
    except ValidationError as e:
        assert not ok, value
        message = df._problem(e)
        assert message.startswith("latency: ") and "\n" not in message
    else:
        assert ok and link.latency == number and math.isfinite(link.latency)


@given(NUMBERISH.filter(lambda v: v is not None))  # None: sms left out
def test_a_whole_number_field_takes_only_whole_numbers_in_range(value):
    number = _as_number(value)
    ok = number is not None and 1 <= number <= df.MAX_SMS and number == int(number)
    data = _with(gemm={"sms": value, "peak_fraction": 0.8})
    try:
        device = df.validate(data, "device", "g.yaml")
    except DeviceFileError as e:
        assert not ok, value
        assert str(e).startswith("g.yaml: gemm.sms: ")
    else:
        assert ok and device.gemm.sms == int(number)


def test_the_docs_examples_load(tmp_path):
    text = (REPO / "docs" / "models-and-costs.md").read_text()
    section = text.split("## Your own hardware: device and link files", 1)[1].split("\n## ", 1)[0]
    device_text, link_text = re.findall(r"```yaml\n(.*?)```", section, re.S)
    (tmp_path / "mygpu.yaml").write_text(device_text)
    (tmp_path / "roce.yaml").write_text(link_text)
    device = load_device(tmp_path / "mygpu.yaml")
    assert device.name == "my-h100-pcie" and device.peak_flops == 756e12
    assert 0 < device.gemm.peak_fraction <= 1 and device.gemm.sms == 114
    assert device.node_link == Link("pcie-nvlink-bridge", 10e-6, 50e9)
    assert device.attention.backward != device.attention.forward
    assert load_link(tmp_path / "roce.yaml") == Link("roce-200g", 12e-6, 21e9)
    # every field of the schema appears in the example
    for name in (*df.DeviceFile.model_fields, *df.GemmFile.model_fields):
        if name not in ("octodsl_version", "peak_fraction", "tiles", "k_ramp", "ceiling"):
            assert f"{name}:" in device_text, name
