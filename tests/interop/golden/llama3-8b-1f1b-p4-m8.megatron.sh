# Megatron-LM arguments for plan "llama3-8b-1f1b-p4-m8" (llama3-8b-1f1b-p4-m8.octo), by `octodsl convert --to megatron`.
# Model llama3-8b: give its sizes (hidden, heads, ...) as for any Megatron run.
# Use: torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...
MEGATRON_ARGS=(
  --pipeline-model-parallel-size 4
  --num-layers 32
  # 4 stages in stage order: E embedding, t a transformer layer (mixer + MLP), L the loss
  --pipeline-model-parallel-layout "Et*8|t*9|t*8|t*7L"
  --tensor-model-parallel-size 1
  # data-parallel size 1: Megatron takes it from the world size, tp 1 x pp 4 x dp 1 = 4 GPUs
  # grad_accumulation_fusion false: weight gradients are added to the buffer by a pass of their own
  --no-gradient-accumulation-fusion
  --micro-batch-size 1
  # 8 micro-batches of 1 per iteration
  --global-batch-size 8
  --seq-length 4096
  # schedule: Megatron's 1F1B, the plan's order exactly
)
