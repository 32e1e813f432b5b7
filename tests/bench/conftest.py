"""Fixtures of the benchmark tests, shared with the tests of what each benchmark measures.

The serving benchmarks start real servers on the toy catalog: like ``tests/reliability``, this
directory takes the session Redis (``redis_server``/``redis_env``, every app reaches it through
``REDIS_URL``) and ``toy_dir`` from ``tests/serving/conftest.py``; the reasons benchmark takes the
toy cascade around the real LLM stage from ``tests/jobs/test_explanations.py``.
"""

from tests.jobs.test_explanations import redis_url, toy  # noqa: F401  (the reasons benchmark's toy cascade)
from tests.serving.conftest import redis_env, redis_server, toy_dir  # noqa: F401  (shared with the serving tests)
