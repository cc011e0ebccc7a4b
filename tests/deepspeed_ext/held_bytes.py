"""Run by test_held_bytes.py in a process of its own: DeepSpeed's pipeline engine trains a bf16
stack of linear layers (one stage, world size 1, a config that sets no `data_types`, as the
executor's examples) for two iterations at the ZeRO stage given, and prints as JSON the
optimizer it built and the bytes per parameter held after the second iteration's last
backward: the parameters, their `.grad`, the optimizer's flat gradient buffers, its fp32
master copies and Adam's state (each storage once)."""

from __future__ import annotations

import json
import sys

import deepspeed
import torch
from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe import schedule

BUFFERS = (
    "fp32_groups_gradients_flat",  # BF16_Optimizer: the flat gradient accumulator
    "fp32_groups_flat_partition",  # BF16_Optimizer: its fp32 master partition
    "single_partition_of_fp32_groups",  # DeepSpeedZeroOptimizer: its fp32 master partition
)


def main(zero: int, port: int) -> None:
    deepspeed.init_distributed(
        "gloo",
        auto_mpi_discovery=False,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
    )
    torch.manual_seed(0)
    module = PipelineModule(
        layers=[torch.nn.Linear(256, 256, bias=False) for _ in range(4)],
        num_stages=1,
        loss_fn=lambda out, _: (out.float() ** 2).mean(),
    )
    config = {
        "train_batch_size": 2,
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": zero},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(
        model=module, model_parameters=module.parameters(), config=config
    )
    params = list(module.parameters())
    held: list[dict[int, int]] = []
    backward = type(engine)._INSTRUCTION_MAP[schedule.BackwardPass]

    def metered(self, *args, **kwargs):
        out = backward(self, *args, **kwargs)
        seen: dict[int, int] = {}
        opt = self.optimizer
        tensors = [t for p in params for t in (p.data, p.grad)]
        tensors += [t for name in BUFFERS for t in getattr(opt, name, None) or ()]
        tensors += [v for state in opt.optimizer.state.values() for v in state.values()]
        for t in tensors:
            if torch.is_tensor(t) and t.numel() > 1:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        held.append(seen)
        return out

    type(engine)._INSTRUCTION_MAP[schedule.BackwardPass] = metered
    for _ in range(2):
        batch = [(torch.randn(1, 256, dtype=torch.bfloat16), torch.zeros(1)) for _ in range(2)]
        engine.train_batch(iter(batch))
    count = sum(p.numel() for p in params)
    print(
        json.dumps(
            {
                "optimizer": type(engine.optimizer).__name__,
                "bytes_per_param": sum(held[-1].values()) / count,
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
