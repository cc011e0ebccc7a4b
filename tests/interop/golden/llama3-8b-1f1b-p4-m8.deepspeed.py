# Stock DeepSpeed for plan "llama3-8b-1f1b-p4-m8" (llama3-8b-1f1b-p4-m8.octo), by `octodsl convert --to deepspeed`.
# `layers`: llama3-8b's 66 layers in octodsl's order, one module or LayerSpec per
# symbol of the pattern `octodsl models llama3-8b` prints (the embedding first, the LM
# head with its loss last; attention and MLP are separate layers).
from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

PARTS = [0, 17, 35, 51, 66]
"""Stage s holds layers PARTS[s] to PARTS[s + 1] - 1 (the plan's partition)."""


class PlanPipelineModule(PipelineModule):
    """A PipelineModule cut at PARTS: DeepSpeed's partition methods balance a weight and
    take no explicit cuts, so this sets them where its __init__ asks for them."""

    def _partition_layers(self, method="parameters"):
        if len(self._layer_specs) != PARTS[-1] or self.num_stages != len(PARTS) - 1:
            raise ValueError(f"the plan cuts {PARTS[-1]} layers into {len(PARTS) - 1} stages, "
                             f"not {len(self._layer_specs)} into {self.num_stages}")
        self.parts = list(PARTS)
        self._set_bounds(start=self.parts[self.stage_id], stop=self.parts[self.stage_id + 1])


def pipeline_module(layers, loss_fn=None, **kwargs):
    """The plan's pipeline over `layers`; kwargs go to PipelineModule."""
    return PlanPipelineModule(layers=layers, loss_fn=loss_fn, topology=PipeDataParallelTopology(num_pp=4, num_dp=1),
                              activation_checkpoint_interval=0, **kwargs)


# ds_config fragment: merge into the config given to deepspeed.initialize.
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 8,
    "train_batch_size": 8,
    "zero_optimization": {
        "stage": 0
    }
}
