"""A/B evaluation: offline comparison of two pipeline configs, online experiment analysis.

``compare`` ranks the same test users with two pipelines (paired bootstrap CIs),
``events`` reads the online event log (Redis stream or Parquet), ``analyze`` turns it into
per-variant CTR / conversion with CIs, z-tests and a sample-ratio check, ``simulate`` replays
held-out users against a live server, ``stats`` holds the closed-form tests and ``report`` /
``plots`` write Markdown and PNGs. Nothing here is imported by serving.
"""
