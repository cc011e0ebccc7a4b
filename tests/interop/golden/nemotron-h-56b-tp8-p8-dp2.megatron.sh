# Megatron-LM arguments for plan "nemotron-h-56b-tp8-p8-dp2" (nemotron-h-56b-tp8-p8-dp2.octo), by `octodsl convert --to megatron`.
# Model nemotron-h-56b: give its sizes (hidden, heads, ...) as for any Megatron run.
# Use: torchrun ... pretrain_hybrid.py (pretrain_mamba.py before PR #3377) "${MEGATRON_ARGS[@]}" ...
MEGATRON_ARGS=(
  --pipeline-model-parallel-size 8
  # nemotron-h-56b's 118 layers, '|' at each of the plan's cuts (Megatron-LM since PR #3377; the embedding and the loss go on the first and last stage by themselves)
  --hybrid-layer-pattern "M-M-M-M*-M-M-M-|M-M*-M-M-M-M-M*|-M-M-M-M-M*-M-M|-M-M-M*-M-M-M-M|-M*-M-M-M-M-M*-|M-M-M-M-M*-M-M-|M-M-M*-M-M-M-M-|M*-M-M-M-M-M-"
  # megatron-core <= 0.16 (PyPI 0.16.1) takes no '|': there, --hybrid-override-pattern "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-" --decoder-last-pipeline-num-layers 13 cuts the same 8 stages
  --tensor-model-parallel-size 8
  --sequence-parallel
  # data-parallel size 2: Megatron takes it from the world size, tp 8 x pp 8 x dp 2 = 128 GPUs
  --use-distributed-optimizer
  # grad_accumulation_fusion false: weight gradients are added to the buffer by a pass of their own
  --no-gradient-accumulation-fusion
  --micro-batch-size 1
  # 32 micro-batches of 1 per iteration, on each of 2 data-parallel copies
  --global-batch-size 64
  --seq-length 8192
  # every stage recomputes in full: one uniform group per stage keeps only the stage's input
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 15
  # schedule: Megatron's 1F1B, the plan's order exactly
)
