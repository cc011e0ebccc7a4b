# Stock DeepSpeed for plan "nemotron-h-56b-tp8-p8-dp2" (nemotron-h-56b-tp8-p8-dp2.octo), by `octodsl convert --to deepspeed`.
# `layers`: nemotron-h-56b's 120 layers in octodsl's order, one module or LayerSpec per
# symbol of the pattern `octodsl models nemotron-h-56b` prints (the embedding first, the LM
# head with its loss last; attention and MLP are separate layers).
# WARNING: tp 8: the topology has a model-parallel axis of 8, but a stock PipelineModule does not split layers over it: the layers must be tensor-parallel themselves (as Megatron-DeepSpeed's are)
from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

PARTS = [0, 16, 31, 46, 61, 76, 91, 106, 120]
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
    return PlanPipelineModule(layers=layers, loss_fn=loss_fn, topology=PipeModelDataParallelTopology(num_pp=8, num_mp=8, num_dp=2),
                              activation_checkpoint_interval=16, **kwargs)


# ds_config fragment: merge into the config given to deepspeed.initialize.
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 32,
    "train_batch_size": 64,
    "zero_optimization": {
        "stage": 1
    }
}
