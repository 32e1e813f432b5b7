"""Benchmarks and probes: each measures one thing and returns a JSON-ready report.

Above ``serving`` and ``jobs`` in the layer order (it drives real servers and reuses the jobs'
training and candidate sources); ``recsys bench ...`` and ``recsys tag bench-logits`` write the
reports. Modules say what they measure: ``serving`` (the HTTP paths under a traffic mix),
``llm_path`` (the served LLM path, cold and warm prefix), ``soak`` (a long run's latency windows
and memory), ``recall_index`` (faiss ANN against exact search), ``llm_stage`` (the LLM stage's
precision, prefix cache and batching), ``llm_backbones`` (how much ranking signal a backbone
carries), ``tagging_logits`` (logit taggers against generation).
"""

from __future__ import annotations

import sys
from pathlib import Path

CASCADE_PARTS = ("split", "recall", "coarse")  # what a benchmark over trained cascades reads


def require_cascades(directories: list[Path], how: str = "run recsys eval there first") -> None:
    """Exit 2 with one ``error:`` line when a directory lacks a trained cascade's parts (the benchmarks'
    command lines refuse bad input as the CLI does)."""
    missing = [f"{d}/{sub}" for d in directories for sub in CASCADE_PARTS if not (d / sub).is_dir()]
    if missing:
        print(f"error: not a trained cascade: no {', '.join(missing)} ({how})", file=sys.stderr)
        raise SystemExit(2)
