"""Device and link files: a user's own GPU or interconnect, in YAML (`.yaml`, `.yml`) or JSON
(`.json`), accepted wherever a built-in device's or link's name is (`get_device`, `get_link`).

A device file gives what `Device` holds (docs/models-and-costs.md, "Your own hardware: device
and link files", has a complete example):

    name: MyGPU                       # shown in reports
    peak_flops: 989.4e12              # dense bf16/fp16 FLOP/s of the matrix units
    fp32_flops: 494.7e12              # dense fp32 (TF32) matmul FLOP/s
    vector_flops: 66.9e12             # fp32 FLOP/s of the vector units
    mem_bandwidth: 3.35e12            # bytes per second
    memory: 80GB                      # bytes, or a size: 80GB, 80GiB
    gemm: {sms: 132, mamf: 0.803, shape: [2048, 2048, 13312]}
    node_link: nvlink4                # a built-in link, or {name, latency, bandwidth}
    inter_node_link: ib-ndr

and optionally `description`, `source`, `attention` (measured flash-attention curves),
`efficiency`, `overheads` (the training framework's per-op costs) and `comm_sms` (the SMs an
overlapped collective takes from the compute under it). A link file gives `name`, `latency` (seconds), `bandwidth` (bytes per second) and
optionally `source`.

Every value is validated here, in one place, and refused with one line naming the file and the
field (`mygpu.yaml: gemm.sms: must be at least 1`): every number is finite and within its range
(the MIN_ and MAX_ constants below, and each field's docstring), written as a number or as a
numeric string (`24e9`, which YAML 1.1 reads as a string); unknown fields are refused (with the
nearest known name). So is a file that is missing, a folder, larger than `MAX_FILE_BYTES`, not
UTF-8, not YAML or JSON, or not a mapping.

A file is read once while it is unchanged: `load_device` and `load_link` keep what they read
by resolved path, modification time and size.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from .. import limits
from ..errors import OctoError
from ..inputs import is_json, parse_data, read_text
from ..inputs import kind_of as _kind
from ..units import exact_size, parse_size
from .attention import AttentionCurve, AttentionModel
from .devices import (
    A100_COMM_SMS,
    A100_SMS,
    CUBLAS_TILES,
    DEVICES,
    GEMM_CALIBRATION,
    LINKS,
    MEGATRON_A100_OVERHEADS,
    CommSms,
    Device,
    Efficiency,
    Overheads,
    _tensor_core_gemm,
)
from .gemm import GemmModel, Tile
from .table import Link

MAX_FILE_BYTES = 1 << 20
"""A device or link file is at most 1 MiB (a complete one is about 2 KiB)."""

MIN_RATE, MAX_FLOPS = 1e6, 1e18
"""FLOP/s: from 1 MFLOP/s to 1 EFLOP/s (a GPU of 2025 has about 1e15 dense bf16)."""
MIN_BANDWIDTH, MAX_BANDWIDTH = 1e6, 1e15
"""Bytes per second: from 1 MB/s to 1 PB/s (HBM3e is about 5e12, NVLink 5 9e11)."""
MAX_LATENCY = 1.0
"""Seconds per message: 0 to 1."""
MIN_FRACTION = 0.001
"""Fractions of a peak: from 0.001 to 1."""
MAX_SMS = 10_000
"""Streaming multiprocessors (compute units): 1 to 10,000 (an H100 has 132, an MI300X 304)."""
MAX_GEMM_DIM = 1 << 20
"""A GEMM shape's m, n and k, and a tile's rows and columns: 1 to 1,048,576."""
MAX_HEAD_DIM = 4096
MAX_TFLOPS = MAX_FLOPS / 1e12
"""An attention curve's TFLOP/s: from 1e-6 (1 MFLOP/s) to 1e6 (1 EFLOP/s)."""
MAX_OVERHEAD_SECONDS = 1.0
"""Seconds a framework adds to one op or message: 0 to 1 (Megatron-LM on A100: about 2e-4)."""
MAX_OVERHEAD_BYTES = 1e6
"""Bytes per activation element a framework moves beyond the counted kernels: 0 to 1e6
(Megatron-LM on A100: about 150)."""
MAX_POINTS = 256
"""Entries of a list: tiles, head dimensions, an attention curve's points."""
MAX_NAME, MAX_TEXT = 64, 2000
"""Characters of a name, and of a description or source."""


class DeviceFileError(OctoError):
    """A device or link file that cannot be read or is invalid; `path` is the file."""


# --- Values -------------------------------------------------------------------------------

_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
"""A number as text: decimal, an optional exponent; no nan, inf, underscores or other digits."""


def _shown(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _number(value: object) -> float | int:
    """`value` read as a number: an int, a float or a numeric string. ValueError otherwise
    (also for nan and inf, however written)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be a number, not {_kind(value)}")
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 64 or not _NUMBER.fullmatch(text):
            raise ValueError(f"{text[:64]!r} is not a number")
        value = float(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _real(
    low: float, high: float, unit: str = "", *, zero: bool = False
) -> Callable[[object], float]:
    """A number from `low` to `high` (`unit` names what it counts), or 0 with `zero`."""

    def parse(value: object) -> float:
        x = _number(value)
        if x == 0 and zero:
            return 0.0
        if x < low:
            raise ValueError(f"must be at least {_shown(low)}{unit}" + (" (or 0)" if zero else ""))
        if x > high:
            raise ValueError(f"must be at most {_shown(high)}{unit}")
        return float(x)

    return parse


def _whole(low: int, high: int) -> Callable[[object], int]:
    """A whole number from `low` to `high` (`128`, `128.0` and `"128"` alike)."""

    def parse(value: object) -> int:
        x = _number(value)
        if x < low:
            raise ValueError(f"must be at least {_shown(low)}")
        if x > high:
            raise ValueError(f"must be at most {_shown(high)}")
        if x != int(x):
            raise ValueError(f"must be a whole number, not {x:g}")
        return int(x)

    return parse


def _size(value: object) -> int:
    """Bytes: a whole number, or a size such as 80GB or 80GiB (octodsl.units)."""
    if isinstance(value, str) and not _NUMBER.fullmatch(value.strip()):
        try:
            x = parse_size(value)
        except ValueError as e:
            raise ValueError(str(e)) from None
    else:
        number = _number(value)
        if number != int(number):
            raise ValueError(f"must be a whole number of bytes, not {number:g}")
        x = int(number)
    if x < 1:
        raise ValueError("must be at least 1 byte (e.g. 80GB)")
    if x > limits.MAX_MEMORY:
        raise ValueError(f"must be at most {exact_size(limits.MAX_MEMORY)}")
    return x


def _text(most: int, *, name: bool = False) -> Callable[[object], str]:
    """Text of at most `most` characters, no control characters (a name: one line, not
    empty)."""

    def parse(value: object) -> str:
        if not isinstance(value, str):
            quote = "" if isinstance(value, list | dict) or value is None else " (quote it)"
            raise ValueError(f"must be text, not {_kind(value)}{quote}")
        if name and not value.strip():
            raise ValueError("must not be empty")
        if len(value) > most:
            raise ValueError(f"must be at most {most} characters, not {len(value):,}")
        allowed = "" if name else "\n\t"
        if any(ord(c) < 32 and c not in allowed or ord(c) == 127 for c in value):
            raise ValueError(
                "must not hold control characters" + ("" if name else " (other than newlines)")
            )
        return value

    return parse


def _tile(value: object) -> Tile:
    """[rows, cols] or [rows, cols, rate]."""
    if not isinstance(value, list | tuple) or len(value) not in (2, 3):
        raise ValueError(
            f"a tile is [rows, cols] or [rows, cols, rate], not {_kind(value)}"
            + (f" of {len(value)}" if isinstance(value, list | tuple) else "")
        )
    parts: list[Callable[[object], float]] = [_TILE_DIM, _TILE_DIM, _FRACTION]
    got: list = []
    for what, parse, item in zip(("rows", "cols", "rate"), parts, value, strict=False):
        try:
            got.append(parse(item))
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
    return Tile(*got)


def _shape(value: object) -> tuple[int, int, int]:
    """[m, n, k]."""
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise ValueError(
            f"a GEMM shape is [m, n, k], not {_kind(value)}"
            + (f" of {len(value)}" if isinstance(value, list | tuple) else "")
        )
    dims = []
    for what, item in zip("mnk", value, strict=True):
        try:
            dims.append(_GEMM_DIM(item))
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
    return dims[0], dims[1], dims[2]


_FRACTION = _real(MIN_FRACTION, 1.0)
_TILE_DIM = _whole(1, MAX_GEMM_DIM)
_GEMM_DIM = _whole(1, MAX_GEMM_DIM)

Flops = Annotated[float, PlainValidator(_real(MIN_RATE, MAX_FLOPS, " FLOP/s"))]
Bandwidth = Annotated[float, PlainValidator(_real(MIN_BANDWIDTH, MAX_BANDWIDTH, " bytes/s"))]
LinkBandwidth = Annotated[
    float, PlainValidator(_real(MIN_BANDWIDTH, MAX_BANDWIDTH, " bytes/s", zero=True))
]
Latency = Annotated[float, PlainValidator(_real(0.0, MAX_LATENCY, " s"))]
Fraction = Annotated[float, PlainValidator(_FRACTION)]
Bytes = Annotated[int, PlainValidator(_size)]
Sms = Annotated[int, PlainValidator(_whole(1, MAX_SMS))]
CommSmCount = Annotated[int, PlainValidator(_whole(0, MAX_SMS))]
HeadDim = Annotated[int, PlainValidator(_whole(1, MAX_HEAD_DIM))]
SeqLen = Annotated[int, PlainValidator(_whole(1, limits.MAX_SEQ_LEN))]
TFlops = Annotated[float, PlainValidator(_real(MIN_RATE / 1e12, MAX_TFLOPS, " TFLOP/s"))]
Steps = Annotated[float, PlainValidator(_real(0.0, MAX_GEMM_DIM))]
OverheadSeconds = Annotated[float, PlainValidator(_real(0.0, MAX_OVERHEAD_SECONDS, " s"))]
OverheadBytes = Annotated[float, PlainValidator(_real(0.0, MAX_OVERHEAD_BYTES, " bytes"))]
Name = Annotated[str, PlainValidator(_text(MAX_NAME, name=True))]
Text = Annotated[str, PlainValidator(_text(MAX_TEXT))]
Version = Annotated[str, PlainValidator(_text(MAX_NAME))]


class _Strict(BaseModel):
    """A mapping of known fields: an unknown one is refused with the nearest known name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise ValueError(_unknown(str(key), list(cls.model_fields)))
        return data


def _unknown(key: str, known: list[str]) -> str:
    near = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(known)}"
    return f"unknown field {key[:64]!r} ({hint})"


# --- Link files ---------------------------------------------------------------------------


class LinkFile(_Strict):
    """A link file, and a device file's own link (`node_link`, `inter_node_link`): a message
    of n bytes takes `latency + n / bandwidth` seconds, per GPU and direction."""

    name: Name
    """Shown in reports (`nvlink`, `my-roce`)."""
    latency: Latency
    """Seconds per message, 0 to 1 (NVLink about 8e-6, InfiniBand 15e-6)."""
    bandwidth: LinkBandwidth
    """Bytes per second one GPU sends in one direction, 1e6 to 1e15 (InfiniBand NDR, one
    400 Gb/s port: about 46e9 achieved); 0 with latency 0 means communication is free."""
    source: Text = ""
    """Where the figures come from (a measurement, a datasheet)."""
    octodsl_version: Version | None = None
    """What printed the file (`octodsl devices NAME --json` writes it); not read."""

    @model_validator(mode="after")
    def _free(self) -> LinkFile:
        if self.bandwidth == 0 and self.latency > 0:
            raise ValueError(
                "bandwidth 0 means free communication: give latency 0 with it, or "
                "a bandwidth in bytes per second"
            )
        return self

    def link(self) -> Link:
        return Link(self.name, self.latency, self.bandwidth, self.source)


def _link_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return _BUILTIN_TAG
    if isinstance(value, dict | LinkFile):
        return _INLINE_TAG
    return None


_BUILTIN_TAG, _INLINE_TAG = "<built-in link>", "<inline link>"
_TAGS = (_BUILTIN_TAG, _INLINE_TAG)
"""The union's member names pydantic puts into an error's location; dropped from messages."""

LinkRef = Annotated[
    Annotated[str, Tag(_BUILTIN_TAG)] | Annotated[LinkFile, Tag(_INLINE_TAG)],
    Discriminator(
        _link_tag,
        custom_error_type="link",
        custom_error_message="must be a built-in link's name or a mapping "
        "{name, latency, bandwidth}",
    ),
]
"""A built-in link's name (`LINKS`: nvlink, nvlink4, nvlink3, ib-ndr, ib-hdr, loopback, none)
or a link of the file's own, {name, latency, bandwidth[, source]}."""


# --- Device files -------------------------------------------------------------------------


class GemmFile(_Strict):
    """How the device's GEMMs' rate depends on their shape (costs/gemm.py). Either the model
    itself, `peak_fraction` (with `tiles` and `k_ramp`, defaults cuBLAS's tiles and 0), or a
    measurement to calibrate it on: `mamf`, the fraction of the peak the best-shaped bf16 GEMM
    reached, at `shape` (with cuBLAS's tiles and the epilogue's ramp that follows from the rate
    and the bandwidth, the mainloop's rate is set so that the model gives `mamf` there:
    `devices._tensor_core_gemm`). Without `sms` (a CPU) a GEMM runs at `peak_fraction` of the
    peak, with no tile or wave quantization."""

    sms: Sms | None = None
    """Streaming multiprocessors (AMD: compute units), 1 to 10,000: tiles run in waves of
    this many. Leave it out for a CPU."""
    peak_fraction: Fraction | None = None
    """Of the dense peak: the rate of a large, well-shaped GEMM's mainloop, 0.001 to 1."""
    tiles: list[Annotated[Tile, PlainValidator(_tile)]] | None = Field(
        default=None, min_length=1, max_length=MAX_POINTS
    )
    """Output tiles the library picks between, each [rows, cols, rate] (rate: the mainloop's
    rate relative to the largest tile's, 0.001 to 1; default 1). Default: cuBLAS's
    (`CUBLAS_TILES`: 256x128, 128x256, 128x128, 128x64 at 2/3, 64x128 at 2/3, 64x64 at 1/2)."""
    k_ramp: Steps | None = None
    """Steps of k a tile's prologue and epilogue cost, 0 to 1,048,576 (default 0)."""
    ceiling: Fraction | None = None
    """Of the dense peak, the most any GEMM reaches (a measured best over shapes), 0.001 to
    1 (default 1; with `mamf`, `mamf` itself)."""
    mamf: Fraction | None = None
    """Measured: the best bf16 GEMM's FLOP/s over the dense peak, 0.001 to 1 (Stas Bekman's
    "Maximum Achievable Matmul FLOPS" benchmark, ml-engineering, compute/accelerator)."""
    shape: Annotated[tuple[int, int, int], PlainValidator(_shape)] | None = None
    """The shape `mamf` was measured at, [m, n, k], each 1 to 1,048,576."""

    @model_validator(mode="after")
    def _one_form(self) -> GemmFile:
        given = self.model_fields_set
        if self.mamf is None and self.peak_fraction is None:
            raise ValueError("give peak_fraction, or mamf and the shape it was measured at")
        if self.mamf is not None:
            if self.peak_fraction is not None:
                raise ValueError("give peak_fraction or mamf, not both (mamf sets it)")
            if self.shape is None:
                raise ValueError("mamf needs the shape it was measured at: shape: [m, n, k]")
            if self.sms is None:
                raise ValueError("mamf calibrates the tile model: give sms too")
            if given & {"tiles", "k_ramp", "ceiling"}:
                raise ValueError(
                    "mamf calibrates cuBLAS's tiles, their ramp and the ceiling: give tiles, "
                    "k_ramp and ceiling with peak_fraction instead"
                )
        elif self.shape is not None:
            raise ValueError("shape goes with mamf (the measurement's shape)")
        if self.sms is None and given & {"tiles", "k_ramp"}:
            raise ValueError(
                "tiles and k_ramp need sms (without it, a CPU, GEMMs run at peak_fraction)"
            )
        return self


class CurveFile(_Strict):
    """Measured TFLOP/s of one direction at one head dimension, by sequence length."""

    seq: list[SeqLen] = Field(min_length=1, max_length=MAX_POINTS)
    """Sequence lengths, strictly increasing, each 1 to 16,777,216."""
    tflops: list[TFlops] = Field(min_length=1, max_length=MAX_POINTS)
    """Achieved TFLOP/s at each length (FlashAttention's convention: the causal half of
    4 s^2 d FLOPs per head forward, 2.5x that backward), 1e-6 to 1e6."""

    @field_validator("seq")
    @classmethod
    def _increasing(cls, seq: list[int]) -> list[int]:
        for a, b in itertools.pairwise(seq):
            if b <= a:
                raise ValueError(f"must be strictly increasing ({b:,} follows {a:,})")
        return seq

    @model_validator(mode="after")
    def _paired(self) -> CurveFile:
        if len(self.seq) != len(self.tflops):
            raise ValueError(
                f"seq has {len(self.seq)} lengths and tflops {len(self.tflops)} "
                "rates: give one rate per length"
            )
        return self


Curves = Annotated[dict[HeadDim, CurveFile], Field(min_length=1, max_length=MAX_POINTS)]


class AttentionFile(_Strict):
    """The device's flash-attention kernel, measured (costs/attention.py): per direction, a
    curve per head dimension, {head_dim: {seq: [...], tflops: [...]}}. Between measured
    lengths the rate is interpolated in log(length), between head dimensions linearly; outside,
    the nearest is taken."""

    source: Text = ""
    """Where the curves were measured (kernel, paper or page)."""
    forward: Curves
    """Forward pass curves by head dimension (1 to 4096)."""
    backward: Curves | None = None
    """Backward pass curves (default: the forward's, for a kernel measured forward + backward
    together)."""

    def model(self) -> AttentionModel:
        def curves(by_dim: dict[int, CurveFile]) -> tuple[AttentionCurve, ...]:
            return tuple(
                AttentionCurve(d, tuple(c.seq), tuple(c.tflops)) for d, c in sorted(by_dim.items())
            )

        forward = curves(self.forward)
        backward = forward if self.backward is None else curves(self.backward)
        return AttentionModel(forward, backward, source=self.source)


_EFFICIENCY = Efficiency()


class EfficiencyFile(_Strict):
    """Achievable fractions of peak of the work that has no shape model (`Efficiency`), each
    0.001 to 1."""

    attention: Fraction = _EFFICIENCY.attention
    """Attention core without measured curves (`attention` absent), of the tensor peak
    (default 0.5)."""
    scan: Fraction = _EFFICIENCY.scan
    """Chunked scans of small matmuls (Mamba2 SSD, gated DeltaNet), of the tensor peak
    (default 0.25)."""
    vector: Fraction = _EFFICIENCY.vector
    """Elementwise recurrences (Mamba1's scan), of `vector_flops` (default 0.5)."""
    bandwidth: Fraction = _EFFICIENCY.bandwidth
    """Memory-bound kernels (norms, activations, the optimizer step), of `mem_bandwidth`
    (default 0.8)."""


_OVERHEADS = MEGATRON_A100_OVERHEADS
"""`Device.overheads`' default."""


class OverheadsFile(_Strict):
    """What a training framework's layers cost per op beyond the kernels the analytical model
    counts (`Overheads`; docs/models-and-costs.md, "Overheads"). Each defaults to Megatron-LM's
    on A100 (`MEGATRON_A100_OVERHEADS`, fitted to ZeroBubble's per-op profile); a CPU or a
    framework without them: 0."""

    f_seconds: OverheadSeconds = _OVERHEADS.f_seconds
    """Host seconds per sub-layer's forward (kernel launches, work between kernels), 0 to 1."""
    b_seconds: OverheadSeconds = _OVERHEADS.b_seconds
    """The same per sub-layer's backward."""
    f_bytes: OverheadBytes = _OVERHEADS.f_bytes
    """Bytes per activation element (tokens x hidden on this GPU) a forward moves beyond the
    counted kernels (copies, casts, fp32 statistics), at the memory bandwidth, 0 to 1e6."""
    b_bytes: OverheadBytes = _OVERHEADS.b_bytes
    """The same per backward."""
    message_seconds: OverheadSeconds = _OVERHEADS.message_seconds
    """Seconds each pipeline message costs beyond its link's time (posting and synchronising
    the send and the receive), 0 to 1."""


class CommSmsFile(_Strict):
    """SMs an overlapped collective holds while it runs under compute (`CommSms`), each 0 to
    `MAX_SMS` and fewer than `gemm.sms`. One left out is a DGX A100's (`A100_COMM_SMS`): tp
    and dp_node as its share of the device's SMs, dp_per_gpu and dp_max as they are."""

    tp: CommSmCount | None = None
    """Transformer Engine's userbuffers kernel of an overlapped tp collective (TE's
    `num_sm`, 16 by default)."""
    dp_node: CommSmCount | None = None
    """NCCL's ring collective of a data-parallel group inside one node: its channels (NCCL's
    log says "N coll channels" with NCCL_DEBUG=INFO)."""
    dp_per_gpu: CommSmCount | None = None
    """The same across nodes: channels per GPU the group has in a node."""
    dp_max: CommSmCount | None = None
    """The most channels of a ring across nodes."""

    def comm_sms(self, sms: int | None) -> CommSms:
        """The CommSms of a device with `sms` SMs (None: a CPU, which loses none); ValueError
        (prefixed with the field) for one that would hold every SM."""
        if sms is None:
            return CommSms()
        a100 = A100_COMM_SMS
        got = {}
        for what, given, default in (
            ("tp", self.tp, round(a100.tp * sms / A100_SMS)),
            ("dp_node", self.dp_node, round(a100.dp_node * sms / A100_SMS)),
            ("dp_per_gpu", self.dp_per_gpu, a100.dp_per_gpu),
            ("dp_max", self.dp_max, a100.dp_max),
        ):
            if given is not None and given >= sms and what != "dp_per_gpu":
                raise ValueError(
                    f"comm_sms.{what}: {given} of the {sms} SMs (gemm.sms) would leave the "
                    "compute under the collective none: give fewer"
                )
            got[what] = min(sms - 1, default) if given is None else given
        return CommSms(**got)


class DeviceFile(_Strict):
    """A device file: one pipeline device (one GPU), as `Device` holds it."""

    name: Name
    """Shown in reports and cost tables' sources."""
    description: Text = ""
    """One line of what it is."""
    source: Text = ""
    """Where the figures come from: datasheet, measurements."""
    peak_flops: Flops
    """Dense bf16/fp16 FLOP/s of the matrix units (tensor cores), 1e6 to 1e18."""
    fp32_flops: Flops
    """Dense fp32 matmul FLOP/s (TF32 on tensor-core GPUs), 1e6 to 1e18."""
    vector_flops: Flops
    """fp32 FLOP/s of the vector (non-tensor) units, 1e6 to 1e18."""
    mem_bandwidth: Bandwidth
    """Memory bandwidth, bytes per second, 1e6 to 1e15."""
    memory: Bytes
    """Memory: bytes, or a size (80GB, 80GiB), 1 byte to 1 PiB."""
    gemm: GemmFile
    """How its GEMMs' rate depends on their shape: {sms, mamf, shape} (calibrated on a
    measurement) or {sms, peak_fraction[, tiles, k_ramp]} (`GemmFile`)."""
    attention: AttentionFile | None = None
    """Measured flash-attention rates (absent: `efficiency.attention` of the peak)."""
    efficiency: EfficiencyFile = EfficiencyFile()
    """Achievable fractions of peak of the work without a shape model (defaults as
    `Efficiency`)."""
    overheads: OverheadsFile = OverheadsFile()
    """Per-op overheads of the training framework (defaults as `Device.overheads`)."""
    comm_sms: CommSmsFile = CommSmsFile()
    """SMs an overlapped collective takes from the compute under it (`CommSmsFile`; a device
    without `gemm.sms`, a CPU, loses none)."""
    node_link: LinkRef = "nvlink"
    """The link between GPUs of one node (tp collectives, pipeline messages and dp collectives
    inside it; default nvlink)."""
    inter_node_link: LinkRef = "ib-ndr"
    """The link between nodes, per GPU (default ib-ndr)."""
    octodsl_version: Version | None = None
    """What printed the file (`octodsl devices NAME --json` writes it); not read."""

    @field_validator("node_link", "inter_node_link")
    @classmethod
    def _builtin_link(cls, value: str | LinkFile) -> str | LinkFile:
        if isinstance(value, str):
            if value.lower() not in LINKS:
                raise ValueError(
                    f"unknown link {value[:64]!r} (built-ins: {', '.join(LINKS)}; "
                    "or a mapping {name, latency, bandwidth})"
                )
            return value.lower()
        return value

    def device(self) -> Device:
        """The Device; ValueError (prefixed with the field) for a GEMM measurement the model
        cannot match."""
        eff = Efficiency(
            self.efficiency.attention,
            self.efficiency.scan,
            self.efficiency.vector,
            self.efficiency.bandwidth,
        )
        g = self.gemm
        if g.mamf is not None:
            assert g.shape is not None and g.sms is not None  # _one_form
            gemm = _tensor_core_gemm(
                g.mamf, g.shape, g.sms, self.peak_flops, self.mem_bandwidth * eff.bandwidth
            )
            if not gemm.peak_fraction <= 1:
                m, n, k = g.shape
                raise ValueError(
                    f"gemm.mamf: {g.mamf:g} at {m}x{n}x{k} would need a mainloop "
                    f"{gemm.peak_fraction:.3g} times as fast as the peak (the tiles and waves "
                    "lose more there, or its bytes bound it): measure a larger, well-shaped "
                    "GEMM, or give peak_fraction"
                )
        else:
            assert g.peak_fraction is not None
            tiles = tuple(g.tiles) if g.tiles is not None else CUBLAS_TILES if g.sms else ()
            gemm = GemmModel(g.peak_fraction, g.sms or 0, tiles, g.k_ramp or 0.0, g.ceiling or 1.0)
        links = [
            v if isinstance(v, str) else v.link() for v in (self.node_link, self.inter_node_link)
        ]
        comm = self.comm_sms.comm_sms(g.sms)
        o = self.overheads
        return Device(
            self.name,
            self.description,
            self.peak_flops,
            self.fp32_flops,
            self.vector_flops,
            self.mem_bandwidth,
            self.memory,
            gemm,
            None if self.attention is None else self.attention.model(),
            eff,
            Overheads(o.f_seconds, o.b_seconds, o.f_bytes, o.b_bytes, o.message_seconds),
            comm,
            node_link=links[0],
            inter_node_link=links[1],
            source=self.source,
        )


# --- Reading ------------------------------------------------------------------------------

_cache: dict[tuple[str, str, int, int], Device | Link] = {}
"""What `_load` built, by kind, resolved path, modification time (ns) and size."""


def load_device(path: str | os.PathLike) -> Device:
    """The device of a device file; DeviceFileError (naming the file, and the field) when it
    cannot be read or is invalid."""
    device = _load(path, "device")
    assert isinstance(device, Device)
    return device


def load_link(path: str | os.PathLike) -> Link:
    """The link of a link file; DeviceFileError as `load_device`."""
    link = _load(path, "link")
    assert isinstance(link, Link)
    return link


def _load(path: str | os.PathLike, kind: str) -> Device | Link:
    shown = str(path)
    try:
        st = os.stat(path)
        key = (kind, str(Path(path).resolve()), st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        raise DeviceFileError(f"no such {kind} file", path=shown) from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        raise DeviceFileError(
            f"cannot read it: {getattr(e, 'strerror', None) or e}", path=shown
        ) from None
    if key not in _cache:
        data = read_mapping(shown, kind)
        _cache[key] = validate(data, kind, shown)
    return _cache[key]


def validate(data: dict, kind: str, path: str) -> Device | Link:
    """A parsed device (`kind` "device") or link file's mapping as a Device or Link;
    DeviceFileError naming `path` and the field otherwise."""
    schema: type[DeviceFile] | type[LinkFile] = DeviceFile if kind == "device" else LinkFile
    try:
        parsed = schema.model_validate(data)
        return parsed.device() if isinstance(parsed, DeviceFile) else parsed.link()
    except ValidationError as e:
        raise DeviceFileError(_problem(e), path=path) from None
    except ValueError as e:  # DeviceFile.device's
        raise DeviceFileError(str(e), path=path) from None


def read_mapping(path: str, kind: str) -> dict:
    """A device or link file's parsed mapping: YAML, or JSON for `.json`. DeviceFileError
    (naming `path`) for a file that is not a small UTF-8 YAML or JSON mapping."""
    text = read_text(path, f"{kind} file", max_bytes=MAX_FILE_BYTES, error=DeviceFileError)
    if not text.strip():
        raise DeviceFileError(
            f"is empty; a {kind} file is a mapping of fields (`octodsl devices "
            "NAME --yaml` prints one to start from)",
            path=path,
        )
    data = parse_data(text, path, json_file=is_json(path), error=DeviceFileError)
    if data is None:  # only comments
        raise DeviceFileError(f"holds no fields; a {kind} file is a mapping of fields", path=path)
    if not isinstance(data, dict):
        raise DeviceFileError(f"a {kind} file is a mapping of fields, not {_kind(data)}", path=path)
    return data


def _problem(e: ValidationError) -> str:
    """The first of a ValidationError's problems as `field.path: what`, and how many more."""
    errors = e.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"] if p not in _TAGS)
    kind = first["type"]
    if kind == "value_error":
        what = str(first["ctx"]["error"])
    elif kind == "missing":
        what = "missing (a required field)"
    elif kind in ("model_type", "dict_type", "model_attributes_type"):
        what = f"must be a mapping of fields, not {_kind(first['input'])}"
    elif kind in ("list_type", "tuple_type"):
        what = f"must be a list, not {_kind(first['input'])}"
    elif kind in ("too_short", "too_long"):
        what = first["msg"].replace("List", "the list").replace("Dictionary", "the mapping")
    else:
        what = first["msg"]
    more = len(errors) - 1
    rest = f" ({more} more problem{'s' if more > 1 else ''} in the file)" if more else ""
    return f"{loc}: {what}{rest}" if loc else f"{what}{rest}"


# --- Writing ------------------------------------------------------------------------------


def link_data(link: Link) -> dict:
    """A link as a link file's mapping."""
    out: dict[str, Any] = {"name": link.name, "latency": link.latency, "bandwidth": link.bandwidth}
    if link.source:
        out["source"] = link.source
    return out


def _link_ref(link: str | Link) -> str | dict:
    return link if isinstance(link, str) else link_data(link)


def device_data(device: Device) -> dict:
    """A device as a device file's mapping, which `validate` reads back into an equal Device:
    a built-in GPU's GEMM model as the measurement it is calibrated on (`mamf`, `shape`)."""
    g = device.gemm
    gemm: dict[str, Any] = {}
    if g.sms:
        gemm["sms"] = g.sms
    measured = GEMM_CALIBRATION.get(device.name) if DEVICES.get(device.name) is device else None
    if (
        measured is not None
        and _tensor_core_gemm(*measured, g.sms, device.peak_flops, device.bandwidth) == g
    ):
        gemm["mamf"], gemm["shape"] = measured[0], list(measured[1])
    else:
        gemm["peak_fraction"] = g.peak_fraction
        if g.sms and g.tiles != CUBLAS_TILES:
            gemm["tiles"] = [[t.rows, t.cols, t.rate] for t in g.tiles]
        if g.sms and g.k_ramp:
            gemm["k_ramp"] = g.k_ramp
        if g.ceiling < 1:
            gemm["ceiling"] = g.ceiling
    out: dict[str, Any] = {
        "name": device.name,
        "description": device.description,
        "source": device.source,
        "peak_flops": device.peak_flops,
        "fp32_flops": device.fp32_flops,
        "vector_flops": device.vector_flops,
        "mem_bandwidth": device.mem_bandwidth,
        "memory": exact_size(device.memory),
        "gemm": gemm,
    }
    if device.attention is not None:
        a = device.attention

        def curves(cs: tuple[AttentionCurve, ...]) -> dict:
            return {c.head_dim: {"seq": list(c.seq), "tflops": list(c.tflops)} for c in cs}

        out["attention"] = {"source": a.source, "forward": curves(a.forward)}
        if a.backward != a.forward:  # else the same (measured forward + backward together)
            out["attention"]["backward"] = curves(a.backward)
    # the device's dataclasses field by field, as the file's mappings name them
    out["efficiency"] = dataclasses.asdict(device.efficiency)
    out["overheads"] = dataclasses.asdict(device.overheads)
    out["comm_sms"] = dataclasses.asdict(device.comm_sms)
    out["node_link"] = _link_ref(device.node_link)
    out["inter_node_link"] = _link_ref(device.inter_node_link)
    return out


def json_ready(data: dict) -> dict:
    """`device_data` with the head dimensions as JSON keys (text), for --json."""
    if "attention" not in data:
        return data
    a = data["attention"]
    return {
        **data,
        "attention": {
            **a,
            **{d: {str(k): v for k, v in a[d].items()} for d in ("forward", "backward") if d in a},
        },
    }


_COMMENTS = {
    ("", "peak_flops"): "dense bf16/fp16 FLOP/s of the matrix units",
    ("", "fp32_flops"): "dense fp32 (TF32) matmul FLOP/s",
    ("", "vector_flops"): "fp32 FLOP/s of the vector units",
    ("", "mem_bandwidth"): "bytes per second",
    ("", "memory"): "bytes, or a size: 80GB, 80GiB",
    ("", "latency"): "seconds per message",
    ("", "bandwidth"): "bytes per second, per GPU and direction (0, with latency 0: free)",
    ("gemm", "sms"): "streaming multiprocessors (leave out for a CPU)",
    ("gemm", "mamf"): "measured: the best bf16 GEMM's share of peak_flops ...",
    ("gemm", "shape"): "... at this m, n, k",
    ("gemm", "peak_fraction"): "a well-shaped GEMM mainloop's share of peak_flops",
    ("gemm", "k_ramp"): "steps of k a tile's prologue and epilogue cost",
    ("gemm", "ceiling"): "the most of peak_flops any GEMM reaches (a measured best)",
    ("efficiency", "attention"): "of peak_flops, for attention without measured curves",
    ("efficiency", "scan"): "of peak_flops, for chunked scans (Mamba2, DeltaNet)",
    ("efficiency", "vector"): "of vector_flops, for elementwise scans (Mamba1)",
    ("efficiency", "bandwidth"): "of mem_bandwidth, for memory-bound kernels",
    ("overheads", "f_seconds"): "host seconds per sub-layer's forward, beyond its kernels",
    ("overheads", "b_seconds"): "the same per backward",
    ("overheads", "f_bytes"): "bytes per activation element a forward moves beyond its kernels",
    ("overheads", "b_bytes"): "the same per backward",
    ("overheads", "message_seconds"): "per pipeline message, beyond its link's time",
    ("comm_sms", "tp"): "SMs an overlapped tp collective takes from the GEMMs under it",
    ("comm_sms", "dp_node"): "NCCL channels (SMs) of a data-parallel ring in one node",
    ("comm_sms", "dp_per_gpu"): "across nodes: per GPU of the ring in a node",
    ("comm_sms", "dp_max"): "across nodes: at most",
}
"""Comments `to_yaml` writes after a field's value, by (parent field, field)."""


class _Dumper(yaml.SafeDumper):
    """Floats in a form both people and YAML 1.1 read as numbers (9.894e+14, 0.8), lists of
    numbers on one line, mappings as blocks."""


def _float(dumper: yaml.SafeDumper, x: float) -> yaml.ScalarNode:
    if not math.isfinite(x) or x == 0 or 1e-3 <= abs(x) < 1e5:
        return dumper.represent_float(x)
    for digits in range(17):  # the fewest that read back as x (16 always do)
        text = f"{x:.{digits}e}"
        if float(text) == x:
            break
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:  # YAML 1.1 reads a float only with a point
        mantissa += ".0"
    return dumper.represent_scalar("tag:yaml.org,2002:float", f"{mantissa}e{int(exponent):+d}")


def _list(dumper: yaml.SafeDumper, items: list) -> yaml.SequenceNode:
    """A list of numbers on one line ([512, 1024]), anything else a block."""
    flow = all(isinstance(i, int | float) for i in items)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flow)


_Dumper.add_representer(float, _float)
_Dumper.add_representer(list, _list)


def to_yaml(data: dict, title: str) -> str:
    """A device or link file's mapping as YAML, `title` as the first comment, each number's
    unit in a comment beside it."""
    text = yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        width=100,
        allow_unicode=True,
        default_flow_style=False,
    )
    lines, parent = [], ""
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        key, sep, value = line.strip().partition(":")
        if indent == 0 and sep:
            parent = key
        comment = _COMMENTS.get(("" if indent == 0 else parent, key)) if sep else None
        if comment and indent in (0, 2) and value.strip() and _scalar(value.strip()):
            line = f"{line}  # {comment}"
        lines.append(line)
    head = [f"# {t}" for t in title.splitlines()]
    return "\n".join([*head, *lines]) + "\n"


def _scalar(text: str) -> bool:
    """Whether a dumped value is a number, a size or a flow list of numbers (nothing a
    comment could cut)."""
    return bool(re.fullmatch(r"[0-9.e+\-]+|[0-9]+[KMGT]i?B|\[[0-9, ]+\]", text))
