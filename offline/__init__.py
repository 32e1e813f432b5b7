"""Offline side: data loaders, the canonical schema, the evaluation protocol and batch jobs."""
