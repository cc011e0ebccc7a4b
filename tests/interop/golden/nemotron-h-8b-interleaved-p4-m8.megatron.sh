# Megatron-LM arguments for plan "nemotron-h-8b-interleaved-p4-m8-v2" (nemotron-h-8b-interleaved-p4-m8.octo), by `octodsl convert --to megatron`.
# Model nemotron-h-8b: give its sizes (hidden, heads, ...) as for any Megatron run.
# Use: torchrun ... pretrain_hybrid.py (pretrain_mamba.py before PR #3377) "${MEGATRON_ARGS[@]}" ...
MEGATRON_ARGS=(
  --pipeline-model-parallel-size 4
  # nemotron-h-8b's 52 layers, '|' at each of the plan's cuts (Megatron-LM since PR #3377; the embedding and the loss go on the first and last stage by themselves); 2 virtual stages per rank, which Megatron derives from the 8 segments
  --hybrid-layer-pattern "M-M-M-M|*-M-M-M|-M-M*-M|-M-M-M-|M*-M-M-|M-M-M*-|M-M-M-M|-M-"
  # megatron-core <= 0.16 (PyPI 0.16.1) takes no '|' and no virtual stages for hybrid models: it cannot run this plan
  --tensor-model-parallel-size 1
  # data-parallel size 1: Megatron takes it from the world size, tp 1 x pp 4 x dp 1 = 4 GPUs
  # grad_accumulation_fusion false: weight gradients are added to the buffer by a pass of their own
  --no-gradient-accumulation-fusion
  --micro-batch-size 1
  # 8 micro-batches of 1 per iteration
  --global-batch-size 8
  --seq-length 4096
  # schedule: Megatron's interleaved 1F1B, the plan's order exactly
)
