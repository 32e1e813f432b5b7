"""Reliability runs against real servers: what an operator loses, or is told, when things break.

Each module drives a real ``uvicorn`` server (its own embedded Redis, a copy or a read-only use
of a trained artifact directory) and returns a plain dict of what it measured:

- ``rules``: answers under rule publishes every 50 ms (never a mixed answer) and publishes
  followed at once by a ``kill -9`` of Redis (never a revert);
- ``artifacts``: each damaged artifact file, and what ``serve``, ``recommend`` and
  ``POST /admin/reload`` show for it;
- ``events``: events kept across a ``kill -9`` of Redis (and the warning when some are not),
  and a flood of anonymous events against the memory cap and the rate limit.

``report`` runs the pieces and writes one result file (``recsys bench reliability``).

Deliberately left out: pass/fail thresholds (the tests assert behaviour at toy size; the
report records figures).
"""
