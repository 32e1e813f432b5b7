"""The core every other package builds on; it imports no stage, job, server or CLI module.

- the stage contract and its optional capabilities (``contract``), the pipeline's stage list and
  limits (``config``), the runner that applies depths, budgets and fallbacks (``pipeline``) and
  bounds each stage call by the request deadline (``watchdog``);
- ids and version names (``names``), bounded YAML/JSON documents (``documents``), experiment
  assignment (``experiments``);
- files: atomic writes (``atomic``), content digests (``digest``), artifact manifests checked
  before a model is parsed (``manifest``), the provenance of result files (``provenance``),
  progress lines (``progress``);
- processes and online state: child processes that die with their parent (``child_guard``),
  Redis clients and their circuit breaker (``redis_client``), the embedded Redis server
  (``redis_server``), the events ledger kept beside it (``event_ledger``).

Deliberately left out: the settings that bundle every package's config (``cascade.settings``),
the stages themselves, serving and the CLI. Nothing heavy is imported here; stage packages load
their models in ``Stage.load``.
"""

__version__ = "0.1.0"
