#!/usr/bin/env bash
# Launch vLLM for the LLM re-ranker on a GPU (vLLM is not a project dependency: install it in the
# GPU image, e.g. `pip install vllm`). Same settings as serve.yaml, spelled as flags.
# Usage: configs/vllm/serve.sh [MODEL_DIR] [PORT] [KV_OFFLOAD_GIB]
set -euo pipefail
MODEL=${1:-artifacts/ml-100k/llm}
PORT=${2:-8100}
OFFLOAD_GIB=${3:-16}
exec vllm serve "$MODEL" \
  --served-model-name recsys-llm \
  --host 0.0.0.0 --port "$PORT" \
  --dtype bfloat16 \
  --quantization fp8 \
  --max-model-len 2048 \
  --gpu-memory-utilization 0.85 \
  --enable-prefix-caching \
  --kv-offloading-backend native --kv-offloading-size "$OFFLOAD_GIB" \
  --max-logprobs 26 \
  --logprobs-mode processed_logprobs \
  --max-num-seqs 256
