#!/usr/bin/env bash
# `make demo`: octodsl's main job on a built-in default.
#   1. generate the classic schedules for nemotron-h-8b on 8 devices x 32 micro-batches,
#   2. lint them, 3. simulate them side by side (H800, NVLink),
#   4. tune a plan for the same setting (80 GiB per device) and compare it with every baseline,
#   5. train a generated plan on the tiny hybrid with the DeepSpeed executor (2 CPU processes;
#      the very first launch on a machine compiles two DeepSpeed ops, 2-3 minutes).
# Outputs go to out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-nemotron-h-8b}
P=${P:-8}
M=${M:-32}
OUT=out/demo
mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. classic schedules for $MODEL, $P devices x $M micro-batches"
plans=()
for s in 1f1b interleaved zb-h1 zb-h2 zb-v dualpipev; do
  octodsl gen "$s" --devices "$P" --microbatches "$M" --model "$MODEL" -o "$OUT/$s.octo"
  plans+=("$OUT/$s.octo")
  echo "  $OUT/$s.octo"
done

step "2. lint"
octodsl lint "${plans[@]}"

step "3. side by side (simulated, H800 with NVLink; speed-up against 1F1B)"
octodsl simulate "${plans[@]}"

step "4. tune partition, placement and schedule together (30 s budget, 80 GiB per device)"
octodsl tune --model "$MODEL" --devices "$P" --microbatches "$M" --memory 80GiB --budget "${BUDGET:-30s}" \
    -o "$OUT/tuned.octo"
octodsl lint "$OUT/tuned.octo"

step "5. train a generated plan on the tiny hybrid (DeepSpeed executor, 2 processes, CPU)"
# the plan states its micro-batch shape: the executor trains it and `simulate` costs it
octodsl gen zb-h1 --devices 2 --microbatches 8 --model nemotron-h-tiny --device cpu \
    --microbatch-size 1 --seq-len 128 -o "$OUT/zb-h1-tiny.octo"
DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} OMP_NUM_THREADS=1 deepspeed --num_gpus 2 examples/train.py \
    --deepspeed_config examples/ds_config.json --schedule "$OUT/zb-h1-tiny.octo" --steps 3 \
    --trace "$OUT/measured.json"
echo "measured trace: $OUT/measured.json (open in https://ui.perfetto.dev)"
