#!/usr/bin/env bash
# A second vLLM instance for /v1/embeddings (a pooling runner; one vLLM engine does not both
# generate and pool). Usage: configs/vllm/serve-embeddings.sh [MODEL_DIR] [PORT]
set -euo pipefail
MODEL=${1:-artifacts/ml-100k/llm}
PORT=${2:-8101}
exec vllm serve "$MODEL" \
  --served-model-name recsys-embed \
  --host 0.0.0.0 --port "$PORT" \
  --runner pooling --convert embed \
  --dtype bfloat16 \
  --max-model-len 2048 \
  --gpu-memory-utilization 0.10
