#!/usr/bin/env bash
# `make demo`: octodsl's main job on a built-in default.
#   1. generate the classic schedules for nemotron-h-8b on 8 devices x 32 micro-batches,
#   2. lint them, 3. simulate them side by side (H800, NVLink),
#   4. tune a plan for the same setting (80 GiB per device) and compare it with every baseline,
#   5. train a generated plan on the tiny hybrid with the DeepSpeed executor (2 CPU processes;
#      the very first launch on a machine compiles two DeepSpeed ops, 2-3 minutes) for 20 steps
#      on a task it learns (octodsl.synthetic's modadd), so the loss falls,
#   6. profile the tiny model at the plan's shape and print the run's losses and its measured
#      step time next to the simulated one (from the profile, and from the analytical costs).
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

step "5. train a generated plan on the tiny hybrid (DeepSpeed executor, 2 processes, CPU): a learnable task, ${STEPS:-20} steps"
# the plan states its micro-batch shape: the executor trains it and `simulate` costs it
TINY=nemotron-h-tiny
TASK=modadd  # x' = (x + 3) mod 16 (octodsl.synthetic): learnt within ~20 steps
octodsl gen zb-h1 --devices 2 --microbatches 8 --model "$TINY" --device cpu \
    --microbatch-size 1 --seq-len 128 -o "$OUT/zb-h1-tiny.octo"
DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} OMP_NUM_THREADS=1 deepspeed --num_gpus 2 examples/train.py \
    --deepspeed_config examples/ds_config.json --schedule "$OUT/zb-h1-tiny.octo" --steps "${STEPS:-20}" \
    --task "$TASK" --trace "$OUT/measured.json" | tee "$OUT/train.log" | grep --line-buffered -E '^({"step"|train.py)'
echo "measured trace: $OUT/measured.json (open in https://ui.perfetto.dev)"

step "6. the same run simulated: per-layer costs profiled now at the plan's shape (one thread), and analytical"
octodsl profile --model "$TINY" --microbatch-size 1 --seq-len 128 -o "$OUT/$TINY.cpu.profile.json" >/dev/null
octodsl compare "$OUT/zb-h1-tiny.octo" --trace "$OUT/measured.json" --profile "$OUT/$TINY.cpu.profile.json" \
    --no-files --json > "$OUT/compare-profile.json"
octodsl compare "$OUT/zb-h1-tiny.octo" --trace "$OUT/measured.json" --model "$TINY" --device cpu \
    --no-files --json > "$OUT/compare-analytical.json"
python examples/demo_summary.py "$OUT/train.log" --task "$TASK" --model "$TINY" \
    --compare "a profile of this machine, not calibrated=$OUT/compare-profile.json" \
    --compare "the analytical costs of the built-in cpu device=$OUT/compare-analytical.json"
echo "octodsl calibrate fits what a profile misses (link, overheads, contention): benchmarks/accuracy.md"
