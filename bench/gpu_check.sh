#!/usr/bin/env bash
# The GPU paths that run without Docker or vLLM, on one GPU: the trainer (DeepSpeed with NCCL,
# bf16, ZeRO 1/2/3, checkpoints checked), its weights into an engine on the same GPU (full and
# LoRA, the version served checked) and the built-in engine (bf16 on the GPU), on models
# built from SmolLM2's shapes with random weights (nothing is fetched). Figures go to stdout
# and, when OUT is set, to $OUT/*.log.
# Run: bash bench/gpu_check.sh [TOKENIZER_DIR]   (default: the tests' SmolLM2 tokenizer)
set -uo pipefail
cd "$(dirname "$0")/.."
TOKENIZER=${1:-.cache/tests/models/smollm2-135m}
OUT=${OUT:-$(mktemp -d)}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.log"
$PY -c "import torch, deepspeed, transformers; print('torch', torch.__version__, 'deepspeed', \
deepspeed.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1 | tee -a "$OUT/gpu.log"

for run in "smollm2-360m 8 1024 5 1,2,3" "smollm2-1.7b 8 1024 3 2,3"; do
  read -r shape samples tokens steps zero <<<"$run"
  timeout 170 $PY bench/gpu_trainer_check.py --shape "$shape" --samples "$samples" \
    --tokens "$tokens" --steps "$steps" --zero "$zero" --tokenizer "$TOKENIZER" \
    >"$OUT/trainer-$shape.log" 2>&1
  echo "trainer $shape: exit $?"; grep -A12 "random)" "$OUT/trainer-$shape.log"
done

timeout 200 $PY bench/gpu_sync_check.py --shape smollm2-360m --tokenizer "$TOKENIZER" \
  >"$OUT/sync.log" 2>&1
echo "sync: exit $?"; grep -A8 "trainer and engine" "$OUT/sync.log"

model=$(mktemp -d)/smollm2-360m
$PY -c "import sys, torch; from pathlib import Path; from bench.gpu_trainer_check import \
build_model; build_model('smollm2-360m', Path(sys.argv[1]), Path(sys.argv[2]), torch.bfloat16)" \
  "$TOKENIZER" "$model" >/dev/null 2>&1
CLAW_ENGINE__DEVICE=cuda CLAW_ENGINE__DTYPE=bfloat16 CLAW_DATA_DIR=$(mktemp -d) \
  timeout 150 $PY bench/engine_bench.py --model "$model" --max-tokens 64 >"$OUT/engine.log" 2>&1
echo "engine: exit $?"; grep -A10 "tokens per answer" "$OUT/engine.log"
tail -30 "$(ls -t "${TMPDIR:-/tmp}"/engine-bench-*.log | head -1)" >"$OUT/engine-server.log" 2>/dev/null
true
