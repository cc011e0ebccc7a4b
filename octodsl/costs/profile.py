"""The profile file: measured per-layer costs of one model on one device (JSON, pydantic).

A profile is accepted wherever the analytical model is: `load_profile(path)` gives the same
`CostTable`. Written by `octodsl profile` (`octodsl.costs.profiler`); no torch needed to read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .. import limits
from ..errors import OctoError
from ..fileio import write_atomic
from ..inputs import read_text
from ..models.spec import ModelSpec
from .table import Calibration, CostTable, LayerCost, Link


class ProfileError(OctoError):
    """A profile that cannot be read or does not fit; the message is for the user."""


Amount = Annotated[float, Field(ge=0)]
"""A factor or a rate: finite (every model below refuses nan and inf) and not negative."""
Seconds = Annotated[float, Field(ge=0, le=limits.MAX_SECONDS)]
Bytes = Annotated[float, Field(ge=0, le=limits.MAX_MEMORY)]

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class MeasuredLayer(BaseModel):
    """One distinct layer, measured once, standing for every layer index in `layers`."""

    model_config = _STRICT

    layers: list[Annotated[int, Field(ge=0)]]
    """Indices (in the model's layer list) of the identical layers this measurement is for."""
    kind: str
    f: Seconds
    """Median forward seconds."""
    b: Seconds
    """Median input-gradient backward seconds (`backward_input`)."""
    w: Seconds
    """Median weight-gradient backward seconds (`backward_weight`)."""
    f_samples: list[Seconds] = []
    """Every timed forward, seconds (the spread shows the noise)."""
    b_samples: list[Seconds] = []
    w_samples: list[Seconds] = []
    act: Bytes
    """Activation bytes held from F until B."""
    act_w: Bytes
    """Of `act`, bytes still held after B until W."""
    params: int = Field(ge=0, le=limits.MAX_INT)
    out_bytes: Bytes
    """Bytes of the layer's output activation."""
    sel_f: Seconds = 0.0
    """Seconds selective recompute adds to B (0 in a profile that did not measure it)."""
    sel_act: Bytes = 0.0
    """Of `act`, the bytes selective recompute drops (0 in a profile that did not measure it)."""


class FittedLink(BaseModel):
    """Point-to-point link between two pipeline devices: latency + bytes / bandwidth."""

    model_config = _STRICT

    latency: Seconds
    """Seconds per message."""
    bandwidth: float = Field(ge=1)
    """Bytes per second (at least 1: a message must take finite time)."""


class ProfileCalibration(BaseModel):
    """Cost parameters fitted against real runs of the executor (`octodsl calibrate`): what a
    per-layer profile cannot see. Applied through the cost table (`Calibration`)."""

    model_config = _STRICT

    created: str
    """ISO 8601 time of the fit."""
    octodsl_version: str | None = Field(default=None, max_length=100)
    """The octodsl that fitted it (None: a calibration from before octodsl recorded it)."""
    source: str
    """What was fitted on: the calibration plans run, or the trace files given."""
    processes: list[int] = []
    """Pipeline process counts the fit saw."""
    link: FittedLink
    op_scale: dict[Literal["F", "B", "W", "BW"], Amount] = {}
    """Per op kind: factor on the profiled per-layer seconds summed over the op's stage."""
    op_overhead: dict[Literal["F", "B", "W", "BW"], Seconds] = {}
    """Per op kind: seconds the executor adds to each op."""
    update_per_param: float = Field(default=0.0, ge=0)
    """Optimizer step seconds per parameter."""
    step_overhead: Seconds = 0.0
    """Seconds per iteration spent synchronising the pipeline at the step."""
    cores: float | None = Field(default=None, ge=0.01, le=limits.MAX_DEVICES)
    """Processors the pipeline's processes share (None: one each); a fit of a loaded machine
    may find less than one, never less than a hundredth (it would divide every op's time)."""
    contention: float = Field(default=0.0, ge=0)
    """Compute slowdown per other process computing at the same time."""
    overlap_slowdown: float = Field(default=0.0, ge=0)
    """Compute slowdown while the process's own messages are in flight."""
    oversubscription: float = Field(default=0.0, ge=0)
    """Compute slowdown per process computing beyond `cores`, on top of the fair share
    (time-slicing: context switches, caches refilled)."""
    act_w_extra: dict[str, Bytes] = {}
    """Per layer kind: bytes a split backward holds from B until W beyond the profiled `act_w`
    (the gradients W restarts from), added to each layer's act_w."""
    fit: dict = {}
    """How well the fit matches the runs it saw (errors per plan, residuals)."""

    def table_calibration(self) -> Calibration:
        # Calibration's dicts are keyed by str: copied item by item, not dict() (which keeps
        # the Literal key type)
        return Calibration(
            scale={k: v for k, v in self.op_scale.items()},
            overhead={k: v for k, v in self.op_overhead.items()},
            update_per_param=self.update_per_param,
            step_overhead=self.step_overhead,
            link=Link("calibrated", self.link.latency, self.link.bandwidth),
            cores=self.cores,
            contention=self.contention,
            overlap_slowdown=self.overlap_slowdown,
            oversubscription=self.oversubscription,
        )


class Profile(BaseModel):
    """Measured costs of a model (at the spec's micro-batch size and sequence length)."""

    model_config = _STRICT

    version: Literal[1] = 1
    model: ModelSpec
    """The spec that was measured, shape included."""
    device: Literal["cpu", "cuda"]
    device_name: str
    """The processor or GPU, as the system names it."""
    threads: int | None = Field(default=None, ge=1)
    """CPU threads torch used (the executor's per-rank count); None on CUDA."""
    memory_method: str
    """How activation bytes were obtained."""
    warmup: int = Field(ge=0)
    repeats: int = Field(ge=1)
    bytes_per_param: int = Field(ge=0, le=limits.MAX_INT)
    """Static bytes per parameter: parameters, gradients and optimizer state."""
    torch_version: str
    octodsl_version: str | None = Field(default=None, max_length=100)
    """The octodsl that measured it (None: a profile from before octodsl recorded it)."""
    created: str
    """ISO 8601 time of the measurement."""
    layers: list[MeasuredLayer]
    calibration: ProfileCalibration | None = None
    """Fitted against real runs (`octodsl calibrate`); absent in a plain profile."""

    @model_validator(mode="after")
    def _covers_every_layer(self):
        indices = sorted(i for m in self.layers for i in m.layers)
        if indices != list(range(self.model.num_layers)):
            raise ValueError(
                f"the measured layers must cover each of the model's "
                f"{self.model.num_layers} layers exactly once"
            )
        for m in self.layers:
            for i in m.layers:
                if self.model.layers[i].kind != m.kind:
                    raise ValueError(
                        f"layer {i} is {self.model.layers[i].kind}, measured as {m.kind}"
                    )
        return self

    def cost_table(self, path: str | Path) -> CostTable:
        """The per-layer cost table, in the model's layer order (`path`: where it was read)."""
        by_index: dict[int, MeasuredLayer] = {i: m for m in self.layers for i in m.layers}
        extra = self.calibration.act_w_extra if self.calibration is not None else {}
        layers = [
            LayerCost(
                kind=m.kind,
                f=m.f,
                b=m.b,
                w=m.w,
                act=m.act,
                act_w=m.act_w + extra.get(m.kind, 0.0),
                static=float(m.params * self.bytes_per_param),
                params=m.params,
                out_bytes=m.out_bytes,
                sel_f=m.sel_f,
                sel_act=m.sel_act,
            )
            for m in (by_index[i] for i in range(self.model.num_layers))
        ]
        spec = self.model
        calibrated = "calibrated " if self.calibration is not None else ""
        return CostTable(
            layers=layers,
            source=f"{calibrated}profile {path} ({spec.name} on {self.device_name})",
            tokens_per_microbatch=spec.tokens,
            meta={
                "model": spec.name,
                "device": self.device_name,
                "threads": self.threads,
                "microbatch_size": spec.microbatch_size,
                "seq_len": spec.seq_len,
                "dtype": spec.dtype,
                "tied_embeddings": spec.tie_embeddings,
                "bytes_per_param": self.bytes_per_param,
                "pattern": spec.pattern,
                "profile": True,
            },
            calibration=None if self.calibration is None else self.calibration.table_calibration(),
        )


def read_profile(path: str | Path) -> Profile:
    """Read and validate a profile file; ProfileError says what is wrong."""
    text = read_text(path, "profile", error=ProfileError)
    try:
        return Profile.model_validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "profile"
        what = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
        raise ProfileError(
            f"{path}: not a valid profile ({where}: {what}; {e.error_count()} problem(s) in all)"
        ) from None


def write_profile(profile: Profile, path: str | Path) -> None:
    """Write a profile as indented JSON (atomically: a failure leaves the old file whole)."""
    write_atomic(path, profile.model_dump_json(indent=1) + "\n")


def load_profile(path: str | Path) -> CostTable:
    """The cost table of a profile file."""
    return read_profile(path).cost_table(path)
