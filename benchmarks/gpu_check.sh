#!/usr/bin/env bash
# The GPU checks of the executor and the cost model, on a machine with CUDA GPUs:
#
#   bash benchmarks/gpu_check.sh [--out DIR] [--device H100|H200|H800] [--dry-run [--gpus N]]
#
# 1. The executor equivalence runs over NCCL, as many ranks as GPUs (at most 4):
#    4 GPUs: tests/deepspeed_ext/tp_cases.py tp (tp 2 x pp 2 against tp 1 for 1f1b, zb-h1, zb-v,
#    sp on and off; tp 2 x pp 1 x dp 2; clipping; a Jamba), harness.py dp (dp 2 x pp 2 against
#    stock DeepSpeed), ep_cases.py ep (qwen3-next-tiny at ep 2 and 4 against ep 1, the
#    all-to-alls over NCCL) and ep_cases.py overlap (dualpipev at ep 2 with its overlap groups
#    run at once, each group's forward on its own thread and stream, against the groups in turn
#    and against ep 1); 2 or 3 GPUs: harness.py plans (every classic plan against stock on 2);
#    1 GPU: harness.py single (tp 1 x pp 1 against stock). Judged by gpu_check.py executor.
# 2. `octodsl profile --device cuda` of nemotron-h-8b (its real layer shapes: hidden 4096,
#    4096 tokens, bf16) and of nemotron-h-tiny; per distinct layer, the analytical F, B, W on
#    --device (default: the GPU's name, if it is a built-in device) against the measured ones.
# 3. examples/train.py on nemotron-h-tiny with a 1f1b plan (zb-h1 on 2+ GPUs) and --trace, then
#    `octodsl compare` of that plan: the simulator with the analytical costs and with the
#    profile against the measured iteration time.
# Writes DIR/gpu_check.md (default: benchmarks/gpu_check/) and every raw file beside it.
# Without a GPU it stops at once with a message (exit 2); --dry-run prints the commands it would
# run for --gpus N GPUs (default 1) and runs none of them.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
BIN=$(dirname "$PY")
OUT=$ROOT/benchmarks/gpu_check
DEVICE=
DRY=0
GPUS=

die() { echo "gpu_check.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=${2:?--out needs a folder}; shift 2 ;;
    --device) DEVICE=${2:?--device needs a name}; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --gpus) GPUS=${2:?--gpus needs a number}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

if [ "$DRY" = 1 ]; then
  GPUS=${GPUS:-1}
  NAME="(dry run)"
else
  [ -z "$GPUS" ] || die "--gpus is for --dry-run; a real run uses every visible GPU"
  [ -x "$PY" ] || die "no Python at $PY (make venv, or set PY=...)"
  GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)") \
    || die "cannot import torch with $PY"
  [ "$GPUS" -gt 0 ] || die "no CUDA GPU is visible (torch.cuda.is_available() is False with $PY); \
run it on a machine with GPUs and a CUDA build of torch"
  NAME=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
fi
case $GPUS in ''|*[!0-9]*) die "--gpus takes a number, not '$GPUS'" ;; esac
[ "$GPUS" -ge 1 ] || die "--gpus must be at least 1"
RANKS=$(( GPUS >= 4 ? 4 : (GPUS >= 2 ? 2 : 1) ))
if [ -z "$DEVICE" ]; then
  case $NAME in *H200*) DEVICE=H200 ;; *H800*) DEVICE=H800 ;; *) DEVICE=H100 ;; esac
fi

run() {  # a command, shown first; in a dry run only shown
  echo "+ $*"
  [ "$DRY" = 1 ] || "$@"
}

run_to() {  # run_to FILE COMMAND...: the command's output into FILE
  local file=$1; shift
  echo "+ $* > $file"
  [ "$DRY" = 1 ] || "$@" > "$file"
}

launch() {  # launch RANKS SCRIPT CASE: a harness case over NCCL, its result in $OUT/CASE.json
  run env DS_ACCELERATOR=cuda OCTO_TEST_BACKEND=nccl PYTHONPATH="$ROOT" PYTHONWARNINGS=ignore \
    "$BIN/deepspeed" --num_gpus "$1" "$ROOT/tests/deepspeed_ext/$2" "$3" "$OUT/$3.json"
}

run mkdir -p "$OUT"
cd "$ROOT"

# 1. the executor equivalence runs
results=()
case $RANKS in
  4) launch 4 tp_cases.py tp; launch 4 harness.py dp; launch 4 ep_cases.py ep
     launch 4 ep_cases.py overlap
     results=("$OUT/tp.json" "$OUT/dp.json" "$OUT/ep.json" "$OUT/overlap.json") ;;
  2) launch 2 harness.py plans; results=("$OUT/plans.json") ;;
  1) launch 1 harness.py single; results=("$OUT/single.json") ;;
esac

# 2. profiles and the per-layer comparison
for model in nemotron-h-8b nemotron-h-tiny; do
  run "$BIN/octodsl" profile --model "$model" --device cuda -o "$OUT/$model.cuda.profile.json"
done

# 3. a measured run, against the simulator with either costs
PIPE=$(( GPUS >= 2 ? 2 : 1 ))
SCHED=$([ "$PIPE" = 2 ] && echo zb-h1 || echo 1f1b)
PLAN=$OUT/tiny-$SCHED-p$PIPE.octo
run "$BIN/octodsl" gen "$SCHED" --devices "$PIPE" --microbatches 8 --model nemotron-h-tiny -o "$PLAN"
run env PYTHONWARNINGS=ignore "$BIN/deepspeed" --num_gpus "$PIPE" examples/train.py \
  --deepspeed_config examples/ds_config.json --schedule "$PLAN" --steps 8 --trace "$OUT/tiny.trace.json"
run_to "$OUT/compare.analytical.json" "$BIN/octodsl" compare "$PLAN" --trace "$OUT/tiny.trace.json" \
  --model nemotron-h-tiny --device "$DEVICE" --json --no-files
run_to "$OUT/compare.profile.json" "$BIN/octodsl" compare "$PLAN" --trace "$OUT/tiny.trace.json" \
  --profile "$OUT/nemotron-h-tiny.cuda.profile.json" --json --no-files

# the report
if [ "$DRY" = 1 ]; then
  echo "+ (writes $OUT/gpu_check.md from the files above: benchmarks/gpu_check.py executor, costs, compare)"
  exit 0
fi
status=0
{
  echo "# GPU check ($NAME x $GPUS, commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d))"
  echo
  echo "Written by \`bash benchmarks/gpu_check.sh\`. Analytical costs: the built-in $DEVICE."
  echo
  echo "## Executor equivalence over NCCL ($RANKS ranks)"
  echo
  "$PY" benchmarks/gpu_check.py executor "${results[@]}" || status=1
  echo
  echo "## Per layer: analytical against measured"
  for model in nemotron-h-8b nemotron-h-tiny; do
    echo
    "$PY" benchmarks/gpu_check.py costs "$OUT/$model.cuda.profile.json" --device "$DEVICE"
  done
  echo
  echo "## Iteration time: simulated against measured ($SCHED, $PIPE device(s), nemotron-h-tiny)"
  echo
  "$PY" benchmarks/gpu_check.py compare "$OUT/compare.analytical.json" "$OUT/compare.profile.json"
} > "$OUT/gpu_check.md"
echo "wrote $OUT/gpu_check.md"
[ "$status" = 0 ] || echo "gpu_check.sh: an executor run is outside its bound (see the table)" >&2
exit "$status"
