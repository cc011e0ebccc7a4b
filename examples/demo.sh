#!/usr/bin/env bash
# `make demo`: octodsl's main job on a built-in default.
#   1. generate the classic schedules for nemotron-h-8b on 8 devices x 32 micro-batches,
#   2. lint them, 3. simulate them side by side (H800, NVLink).
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
