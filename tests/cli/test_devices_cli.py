"""`octodsl devices`, and device and link files wherever the command line takes a device or a
link: the same results as the built-in they copy, their links used where a built-in device's
would be, and every bad file refused with one line naming the file and the field."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from octodsl.cli import build_parser, main
from octodsl.cli.completion import script
from octodsl.costs.devices import DEVICES, LINKS, get_device, get_link

GPU = {
    "name": "MyGPU",
    "peak_flops": 1e15,
    "fp32_flops": 5e14,
    "vector_flops": 6e13,
    "mem_bandwidth": 3e12,
    "memory": "80GB",
    "gemm": {"sms": 132, "mamf": 0.8, "shape": [2048, 2048, 13312]},
}


@pytest.fixture
def plan(here, capsys) -> str:
    """`octodsl gen 1f1b -p 4 -m 8 --model nemotron-h-8b` with 2 GPUs per node (so some
    pipeline messages leave a node)."""
    assert (
        main(
            [
                "gen",
                "1f1b",
                "-p",
                "4",
                "-m",
                "8",
                "--model",
                "nemotron-h-8b",
                "--gpus-per-node",
                "2",
                "-o",
                "plan.octo",
            ]
        )
        == 0
    )
    capsys.readouterr()
    return "plan.octo"


def _out(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _simulated(capsys, *argv: str) -> dict:
    result = json.loads(_out(capsys, "simulate", *argv, "--json"))
    result.pop("simulate_seconds")
    return result


def _error(capsys, *argv: str) -> str:
    """The one line a refused command prints (exit 2, nothing on standard output)."""
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("octodsl: error: ") and captured.err.count("\n") == 1, (
        captured.err
    )
    assert "Traceback" not in captured.err
    return captured.err.removeprefix("octodsl: error: ").rstrip("\n")


# --- octodsl devices ----------------------------------------------------------------------


def test_the_list_has_every_builtin(capsys):
    out = _out(capsys, "devices")
    for name in (*DEVICES, *LINKS):
        assert f" {name} " in out, name
    assert "989.4 TFLOP/s" in out and "80GB" in out and "3.35 TB/s" in out and "132" in out
    assert f"{DEVICES['H800'].gemm.peak_fraction:.3f}" in out  # its GEMM mainloop rate
    for item in (*DEVICES.values(), *LINKS.values()):
        assert f"{item.name}: {item.source}" in " ".join(out.split()), item.name
    listed = json.loads(_out(capsys, "devices", "--json"))
    assert [d["name"] for d in listed["devices"]] == list(DEVICES)
    assert [link["name"] for link in listed["links"]] == list(LINKS)


@pytest.mark.parametrize("name", [*DEVICES, *LINKS])
def test_yaml_round_trips_every_builtin(here, capsys, name):
    text = _out(capsys, "devices", name, "--yaml")
    assert text.startswith("# octodsl ")
    (here / "mine.yaml").write_text(text)
    if name in DEVICES:
        assert get_device("mine.yaml") == DEVICES[name]
    else:
        assert get_link("mine.yaml") == LINKS[name]
    # --json prints the same file as JSON, which reads back too
    (here / "mine.json").write_text(_out(capsys, "devices", name, "--json"))
    assert (get_device if name in DEVICES else get_link)("mine.json") == (
        DEVICES.get(name) or LINKS[name]
    )


def test_one_device_in_full_and_a_file_checked(here, capsys):
    out = _out(capsys, "devices", "h100")
    assert "NVIDIA H100 SXM" in out and "nvlink4: 370 GB/s, 8 us" in out
    (here / "gpu.yaml").write_text(yaml.safe_dump(GPU))
    out = _out(capsys, "devices", "gpu.yaml")
    assert "MyGPU" in out and "1 PFLOP/s" in out and "132 SMs" in out
    (here / "link.yaml").write_text("name: roce\nlatency: 1e-5\nbandwidth: 25e9\n")
    assert "25 GB/s" in _out(capsys, "devices", "link.yaml")
    assert "bandwidth: 2.5e+10" in _out(capsys, "devices", "link.yaml", "--yaml")


def test_devices_refusals(here, capsys):
    assert _error(capsys, "devices", "tpu").startswith(
        "unknown device or link 'tpu' (devices: H800"
    )
    assert _error(capsys, "devices", "--yaml").startswith("--yaml prints one device")
    assert "not allowed with argument" in _error(capsys, "devices", "H800", "--yaml", "--json")
    (here / "bad.yaml").write_text("name: x\nlatency: -1\nbandwidth: 1e9\n")
    assert _error(capsys, "devices", "bad.yaml") == "bad.yaml: latency: must be at least 0 s"


# --- Files wherever a device or a link is taken --------------------------------------------


def test_a_device_file_simulates_as_the_builtin_it_copies(plan, here, capsys):
    (here / "h800.yaml").write_text(_out(capsys, "devices", "H800", "--yaml"))
    (here / "h800.json").write_text(_out(capsys, "devices", "H800", "--json"))
    builtin = _simulated(capsys, plan, "--device", "H800")
    assert _simulated(capsys, plan, "--device", "h800.yaml") == builtin
    assert _simulated(capsys, plan, "--device", "h800.json") == builtin
    assert _simulated(capsys, plan, "--device", "h800.yaml", "--tp", "2") == _simulated(
        capsys, plan, "--device", "H800", "--tp", "2"
    )


def test_a_device_file_on_every_command(plan, here, capsys):
    (here / "gpu.yaml").write_text(yaml.safe_dump(GPU))
    assert "analytical costs on gpu.yaml" in _out(
        capsys, "models", "nemotron-h-tiny", "--device", "gpu.yaml"
    )
    assert (
        main(
            [
                "gen",
                "1f1b",
                "-p",
                "2",
                "-m",
                "4",
                "--model",
                "nemotron-h-tiny",
                "--device",
                "gpu.yaml",
                "-o",
                "g.octo",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "tune",
                "--model",
                "nemotron-h-tiny",
                "-p",
                "2",
                "-m",
                "4",
                "--device",
                "gpu.yaml",
                "--budget",
                "2s",
                "-o",
                "t.octo",
                "--json",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "tune",
                "--model",
                "nemotron-h-tiny",
                "--gpus",
                "4",
                "--global-batch",
                "8",
                "--device",
                "gpu.yaml",
                "--budget",
                "2s",
                "-o",
                "c.octo",
                "--json",
            ]
        )
        == 0
    )
    capsys.readouterr()
    # the memory limit comes from the file
    assert _simulated(capsys, plan, "--device", "gpu.yaml")["memory_limit"] == 80 * 10**9


def test_a_link_file_as_the_inter_node_link(plan, here, capsys):
    slow = {"name": "slow-ib", "latency": 2e-5, "bandwidth": "12e9", "source": "a test"}
    (here / "slow.yaml").write_text(yaml.safe_dump(slow))
    (here / "ndr.yaml").write_text(_out(capsys, "devices", "ib-ndr", "--yaml"))
    default = _simulated(capsys, plan)
    assert _simulated(capsys, plan, "--inter-node-link", "ndr.yaml") == default  # H800's own
    slowed = _simulated(capsys, plan, "--inter-node-link", "slow.yaml")
    assert slowed["iteration_time"] > default["iteration_time"]
    text = json.dumps(slowed)
    assert "slow-ib" in text and "ib-ndr" not in text and "ib-ndr" in json.dumps(default)
    # as --link and --dp-link too
    assert _simulated(capsys, plan, "--link", "slow.yaml")["link"] == "slow-ib"
    dp = _simulated(capsys, plan, "--dp", "2")
    assert (
        _simulated(capsys, plan, "--dp", "2", "--dp-link", "slow.yaml")["iteration_time"]
        > dp["iteration_time"]
    )


def test_a_device_files_links_are_its_defaults(plan, here, capsys):
    mine = {
        **GPU,
        "node_link": {"name": "my-link", "latency": 1e-5, "bandwidth": 1e11},
        "inter_node_link": {"name": "my-ib", "latency": 3e-5, "bandwidth": 1e10},
    }
    (here / "gpu.yaml").write_text(yaml.safe_dump(mine))
    inline = _simulated(capsys, plan, "--device", "gpu.yaml")
    assert inline["link"] == "my-link" and "my-ib" in json.dumps(inline)
    (here / "l1.yaml").write_text(yaml.safe_dump(mine["node_link"]))
    (here / "l2.yaml").write_text(yaml.safe_dump(mine["inter_node_link"]))
    (here / "plain.yaml").write_text(yaml.safe_dump(GPU))
    given = _simulated(
        capsys, plan, "--device", "plain.yaml", "--link", "l1.yaml", "--inter-node-link", "l2.yaml"
    )
    assert given == inline
    # a built-in device's inter-node link is its default too (A100: InfiniBand HDR)
    a100 = json.dumps(_simulated(capsys, plan, "--device", "A100"))
    assert "ib-hdr" in a100 and "ib-ndr" not in a100


HOSTILE = [
    ("neg.yaml", "peak_flops: -1e15", "neg.yaml: peak_flops: must be at least 1e+06 FLOP/s"),
    ("nan.yaml", "peak_flops: .nan", "nan.yaml: peak_flops: must be a finite number"),
    ("inf.yaml", "peak_flops: .inf", "inf.yaml: peak_flops: must be a finite number"),
    ("big.yaml", "peak_flops: 1e400", "big.yaml: peak_flops: must be a finite number"),
    ("huge.yaml", "peak_flops: 1.0e+30", "huge.yaml: peak_flops: must be at most 1e+18 FLOP/s"),
    ("text.yaml", "peak_flops: fast", "text.yaml: peak_flops: 'fast' is not a number"),
    ("sms.yaml", "gemm: {sms: 0, peak_fraction: 0.8}", "sms.yaml: gemm.sms: must be at least 1"),
    (
        "unknown.yaml",
        "peak_flop: 1e15",
        "unknown.yaml: unknown field 'peak_flop' (did you mean 'peak_flops'?)",
    ),
    (
        "seq.yaml",
        "attention: {forward: {64: {seq: [512, 1024, 2048], tflops: [1, 2]}}}",
        "seq.yaml: attention.forward.64: seq has 3 lengths and tflops 2 rates",
    ),
    (
        "order.yaml",
        "attention: {forward: {64: {seq: [2048, 1024], tflops: [1, 2]}}}",
        "order.yaml: attention.forward.64.seq: must be strictly increasing (1,024 follows 2,048)",
    ),
]


def _gpu_yaml(line: str) -> str:
    """GPU's file with `line` replacing (or adding) its top-level field."""
    key = line.split(":", 1)[0]
    rest = {
        k: v for k, v in GPU.items() if k != key and not (key == "peak_flop" and k == "peak_flops")
    }
    return yaml.safe_dump(rest) + line + "\n"


@pytest.mark.parametrize("name,line,message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_device_files_are_one_line(plan, here, capsys, name, line, message):
    (here / name).write_text(_gpu_yaml(line))
    assert _error(capsys, "simulate", plan, "--device", name).startswith(message)
    assert _error(capsys, "models", "nemotron-h-tiny", "--device", name).startswith(message)
    assert _error(
        capsys,
        "tune",
        "--model",
        "nemotron-h-tiny",
        "-p",
        "2",
        "-m",
        "4",
        "--device",
        name,
        "-o",
        "t.octo",
    ).startswith(message)


def test_hostile_files_of_every_kind(plan, here, capsys):
    (here / "list.yaml").write_text("- 1\n- 2\n")
    (here / "binary.yaml").write_bytes(b"name: \xc3\x28\n")
    (here / "folder.yaml").mkdir()
    (here / "empty.json").write_text("")
    (here / "big.yaml").write_text("#" * (2 << 20))
    (here / "broken.json").write_text('{"name": "x",}')
    cases = [
        ("list.yaml", "list.yaml: a device file is a mapping of fields, not a list"),
        ("binary.yaml", "binary.yaml: not UTF-8 text"),
        ("folder.yaml", "folder.yaml: is a folder, not a device file"),
        ("empty.json", "empty.json: is empty"),
        ("big.yaml", "big.yaml: is 2,097,152 bytes; a device file is at most 1MiB"),
        ("broken.json", "broken.json: not valid JSON"),
        ("gone.yaml", "gone.yaml: no such device file"),
        ("tpu", "--device: unknown device 'tpu' (built-ins: H800"),
    ]
    for name, message in cases:
        assert _error(capsys, "simulate", plan, "--device", name).startswith(message), name
    for option in ("--link", "--inter-node-link", "--dp-link"):
        assert _error(capsys, "simulate", plan, option, "list.yaml").startswith(
            "list.yaml: a link file is a mapping of fields, not a list"
        )
        assert _error(capsys, "simulate", plan, option, "ethernet").startswith(
            f"{option}: unknown link 'ethernet'"
        )
    (here / "link.yaml").write_text("name: x\nlatency: 1e-5\nbandwidth: -5\n")
    assert (
        _error(
            capsys,
            "tune",
            "--model",
            "nemotron-h-tiny",
            "-p",
            "2",
            "-m",
            "4",
            "--inter-node-link",
            "link.yaml",
            "-o",
            "t.octo",
        )
        == "link.yaml: bandwidth: must be at least 1e+06 bytes/s (or 0)"
    )


# --- Shell completion ---------------------------------------------------------------------

BASH = shutil.which("bash")


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_completion_offers_the_builtins_then_files(here):
    path = here / "octodsl.bash"
    path.write_text(script(build_parser(), "bash"))
    (here / "mygpu.yaml").write_text("")

    def complete(*words: str) -> list[str]:
        line = ["octodsl", *words]
        program = (
            f"source {path}\n"
            f"COMP_WORDS=({' '.join(repr(w) for w in line)}); COMP_CWORD={len(line) - 1}\n"
            "_octodsl_complete\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
        )
        done = subprocess.run(
            [BASH, "--norc", "--noprofile", "-c", program],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=here,
        )
        assert done.returncode == 0 and not done.stderr, done.stderr
        return [w for w in done.stdout.splitlines() if w]

    assert complete("simulate", "--device", "H") == ["H800", "H100", "H200"]
    assert complete("models", "--device", "") == list(DEVICES)
    assert complete("tune", "--link", "nv") == ["nvlink", "nvlink4", "nvlink3"]
    assert complete("simulate", "--inter-node-link", "ib") == ["ib-ndr", "ib-hdr"]
    # no name matches: nothing offered here, so `complete -o default` completes file names
    assert complete("simulate", "--device", "my") == []
    assert complete("devices", "--") == ["--help", "--yaml", "--json"]
