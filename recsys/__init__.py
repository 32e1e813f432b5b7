"""Shared core of the hybrid recommender: the stage contract, settings, pipeline runner, CLI.

Nothing heavy is imported here; stage packages load their models in ``Stage.load``.
"""

__version__ = "0.1.0"
