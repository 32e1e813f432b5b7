"""The shipped vLLM launch settings: the YAML and the script agree and carry what the client needs."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

VLLM = Path(__file__).resolve().parents[2] / "configs" / "vllm"


def _script_flags(text: str) -> dict[str, str]:
    flags = dict(re.findall(r"--([a-z-]+)[ =]((?:\"[^\"]*\")|[^\s\\-][^\s\\]*)?", text))
    return {k: v.strip('"') for k, v in flags.items()}


def test_serve_yaml_and_script_agree_on_every_setting() -> None:
    config = yaml.safe_load((VLLM / "serve.yaml").read_text())
    flags = _script_flags((VLLM / "serve.sh").read_text())
    assert config["quantization"] == flags["quantization"] == "fp8"
    assert config["enable-prefix-caching"] is True and "enable-prefix-caching" in flags
    assert config["kv-offloading-backend"] == flags["kv-offloading-backend"] == "native"
    assert config["kv-offloading-size"] > 0 and "kv-offloading-size" in flags
    # listwise asks for up to 26 letters and needs post-logit_bias values (llm_rerank.remote)
    assert config["max-logprobs"] == int(flags["max-logprobs"]) >= 26
    assert config["logprobs-mode"] == flags["logprobs-mode"] == "processed_logprobs"
    shared = set(config) - {"model"}
    assert shared <= set(flags), f"only in serve.yaml: {sorted(shared - set(flags))}"
    assert "guided" not in (VLLM / "serve.yaml").read_text() + (VLLM / "serve.sh").read_text()
