"""`octodsl devices [NAME] [--yaml | --json]`: the built-in devices and links the analytical
costs run on (each device's peak, memory, bandwidth, GEMM model and links, each link's bandwidth
and latency, and where the figures come from); with NAME (a built-in device or link, or a
device or link file) that one in full, and with `--yaml` as a file to start your own from
(costs/device_file.py: `--device FILE`, `--link FILE` wherever a name is taken)."""

from __future__ import annotations

from ..costs.devices import Device
from ..costs.table import Link
from .common import UserError, print_json, stdout_console

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def register(sub) -> None:
    p = sub.add_parser(
        "devices",
        help="list the built-in devices and links, or print one as a "
        "device file to start your own from",
    )
    p.add_argument(
        "name",
        nargs="?",
        metavar="NAME",
        help="a built-in device or link (or a device or link file, to check it): show it in full",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--yaml",
        action="store_true",
        help="print NAME as a device (or link) file, a starting point for your own "
        "hardware (--device FILE)",
    )
    out.add_argument(
        "--json",
        action="store_true",
        help="print JSON: the list, or NAME as a device (or link) file",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..costs import device_file as df
    from ..costs.devices import DEVICES, LINKS

    if args.name is None:
        if args.yaml:
            raise UserError(
                "--yaml prints one device: give its NAME (`octodsl devices` lists them)"
            )
        if args.json:
            print_json(
                {
                    "devices": [df.json_ready(df.device_data(d)) for d in DEVICES.values()],
                    "links": [df.link_data(link) for link in LINKS.values()],
                }
            )
            return 0
        _list()
        return 0
    item = _resolve(args.name)
    is_link = isinstance(item, Link)
    data = df.link_data(item) if isinstance(item, Link) else df.device_data(item)
    if args.json:
        print_json(data if is_link else df.json_ready(data))
    elif args.yaml:
        kind = "link" if is_link else "device"
        option = "--link or --inter-node-link" if is_link else "--device"
        title = (
            f"octodsl {kind} file: {item.name}, printed by `octodsl devices {args.name} "
            f"--yaml`.\nEdit it for your own hardware and give its path as {option}; the "
            'fields and their units:\ndocs/models-and-costs.md, "Your own hardware: device '
            'and link files".'
        )
        print(df.to_yaml(data, title), end="")
    elif isinstance(item, Link):
        _show_link(item)
    else:
        _show_device(item)
    return 0


def _resolve(name: str):
    """The built-in device or link of this name, else the device or link file (a link file
    holds latency or bandwidth and none of a device's fields)."""
    from ..costs import device_file as df
    from ..costs.devices import DEVICES, LINKS, builtin_device, is_file_name

    device = builtin_device(name)
    if device is not None:
        return device
    if name.lower() in LINKS:
        return LINKS[name.lower()]
    if not is_file_name(name):
        raise UserError(
            f"unknown device or link {name!r} (devices: {', '.join(DEVICES)}; links: "
            f"{', '.join(LINKS)}; or a device or link file, .yaml or .json)"
        )
    data = df.read_mapping(name, "device or link")
    link_fields = set(df.LinkFile.model_fields)
    is_link = bool({"latency", "bandwidth"} & set(data)) and set(data) <= link_fields
    return df.validate(data, "link" if is_link else "device", name)


def _rate(x: float, unit: str) -> str:
    """989.4e12, 'FLOP/s' -> '989.4 TFLOP/s'."""
    for scale, prefix in _PREFIXES:
        if abs(x) >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}"


def _latency(seconds: float) -> str:
    if seconds == 0:
        return "0"
    return f"{seconds * 1e6:.3g} us" if seconds < 1e-3 else f"{seconds * 1e3:.3g} ms"


def _link_name(link: str | Link) -> str:
    return link if isinstance(link, str) else link.name


def _bandwidth(link: Link) -> str:
    return "free" if link.bandwidth == 0 else _rate(link.bandwidth, "B/s")


def _list() -> None:
    from rich.table import Table
    from rich.text import Text

    from ..costs.devices import DEVICES, LINKS
    from ..units import exact_size

    out = stdout_console()
    devices = Table(
        title="built-in devices (`octodsl devices NAME` shows one in full, "
        "`--yaml` as a device file)"
    )
    for col in (
        "device",
        "bf16 peak",
        "memory",
        "bandwidth",
        "SMs",
        "GEMM peak",
        "node link",
        "inter-node link",
    ):
        devices.add_column(col, justify="right" if col in ("SMs", "GEMM peak") else "left")
    for d in DEVICES.values():
        devices.add_row(
            Text(d.name),
            _rate(d.peak_flops, "FLOP/s"),
            exact_size(d.memory),
            _rate(d.mem_bandwidth, "B/s"),
            str(d.gemm.sms or "-"),
            f"{d.gemm.peak_fraction:.3f}",
            _link_name(d.node_link),
            _link_name(d.inter_node_link),
        )
    out.print(devices)
    links = Table(title="built-in links (per GPU and direction)")
    for col in ("link", "bandwidth", "latency"):
        links.add_column(col)
    for link in LINKS.values():
        links.add_row(Text(link.name), _bandwidth(link), _latency(link.latency))
    out.print(links)
    out.print(Text("sources:"))
    items: list[Device | Link] = [*DEVICES.values(), *LINKS.values()]
    for item in items:
        if item.source:
            out.print(Text(f"  {item.name}: {item.source}"), soft_wrap=True)


def _show_device(d) -> None:
    from rich.table import Table
    from rich.text import Text

    from ..costs.devices import get_link
    from ..units import exact_size

    g, e = d.gemm, d.efficiency
    table = Table(
        title=Text(f"{d.name}: {d.description}" if d.description else d.name), show_header=False
    )
    table.add_column("field")
    table.add_column("value")
    if g.sms:
        gemm = (
            f"{g.sms} SMs, mainloop at {g.peak_fraction:.4g} of the peak, "
            f"{len(g.tiles)} tile shapes" + (f", k ramp {g.k_ramp:g}" if g.k_ramp else "")
        )
    else:
        gemm = f"{g.peak_fraction:.4g} of the peak (no tile or wave quantization)"
    if d.attention is not None:
        dims = ", ".join(str(c.head_dim) for c in d.attention.forward)
        attention = f"measured curves, head dims {dims}" + (
            f" ({d.attention.source})" if d.attention.source else ""
        )
    else:
        attention = f"{e.attention:g} of the peak"
    rows = [
        ("peak_flops", _rate(d.peak_flops, "FLOP/s") + " dense bf16/fp16"),
        ("fp32_flops", _rate(d.fp32_flops, "FLOP/s")),
        ("vector_flops", _rate(d.vector_flops, "FLOP/s")),
        (
            "mem_bandwidth",
            f"{_rate(d.mem_bandwidth, 'B/s')} ({e.bandwidth:g} of it achieved: "
            f"{_rate(d.bandwidth, 'B/s')})",
        ),
        ("memory", f"{exact_size(d.memory)} ({d.memory:,} bytes)"),
        ("gemm", gemm),
        ("attention", attention),
        (
            "efficiency",
            f"attention {e.attention:g}, scan {e.scan:g}, vector {e.vector:g}, "
            f"bandwidth {e.bandwidth:g}",
        ),
    ]
    c = d.comm_sms
    if g.sms:
        rows.append(
            (
                "comm_sms",
                f"SMs an overlapped collective takes from the compute under it: tp {c.tp}; "
                f"data-parallel ring {c.dp_node} in one node, across nodes {c.dp_per_gpu} "
                f"per GPU of it in a node, at most {c.dp_max}",
            )
        )
    for field in ("node_link", "inter_node_link"):
        link = get_link(getattr(d, field))
        rows.append((field, f"{link.name}: {_bandwidth(link)}, {_latency(link.latency)}"))
    if d.source:
        rows.append(("source", d.source))
    for field, value in rows:
        table.add_row(field, Text(value))
    stdout_console().print(table)


def _show_link(link: Link) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(link.name), show_header=False)
    table.add_column("field")
    table.add_column("value")
    for field, value in (
        ("bandwidth", _bandwidth(link)),
        ("latency", _latency(link.latency)),
        ("source", link.source),
    ):
        if value:
            table.add_row(field, Text(value))
    stdout_console().print(table)
