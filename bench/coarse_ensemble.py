"""What the coarse ranker's ensemble costs per request: the served fits against the first one alone.

``python -m bench.coarse_ensemble --artifacts DIR [DIR ...] --out FILE`` loads the cascade a
``recsys train`` or ``recsys eval`` left in each ``DIR`` (``coarse.ensemble`` fits), recalls the test
request of a seeded sample of users, and times the coarse stage on the same candidates with every
fit and with the first fit alone, the two interleaved request by request (the order alternating),
so machine load falls on both alike. Reported per directory: the candidates per request and p50/p90
milliseconds of each.

Deliberately left out: the rest of the light path (recall, rules and fusion do not change with the
ensemble) and concurrency.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import require_cascades
from cascade.registry import build_pipeline
from cascade.settings import Settings
from coarse_rank.stage import CoarseStage
from jobs.evaluation.cascade_run import requests_for_user
from offline.split import Split
from recsys.contract import Candidates
from recsys.provenance import write_result


def time_ensemble(artifact_dir: Path, settings: Settings, users: int, seed: int = 0) -> dict[str, Any]:
    """p50/p90 coarse-stage milliseconds with every fit and with the first alone, on ``users`` sampled users."""
    split = Split.load(artifact_dir / "split")
    pipeline = build_pipeline(settings, artifact_dir, only=("recall", "coarse"), phase="test").without_budgets()
    stages = {spec.name: stage for spec, stage in pipeline.stages}
    recall, coarse = stages["recall"], stages["coarse"]
    if not isinstance(coarse, CoarseStage):
        raise TypeError(f"{artifact_dir}: the coarse stage is a {type(coarse).__name__}, not a CoarseStage")
    served = {"every fit": coarse, "first fit": coarse.with_fits(1)}
    sample = np.random.default_rng(seed).choice(split.n_users, min(users, split.n_users), replace=False)
    ms: dict[str, list[float]] = {"every fit": [], "first fit": []}
    sizes = []
    for i, u in enumerate(sample):
        request = requests_for_user(split, int(u), "test")
        candidates = recall.run(request, Candidates.empty())
        sizes.append(len(candidates))
        for label in ("every fit", "first fit") if i % 2 else ("first fit", "every fit"):
            t0 = time.perf_counter()
            served[label].run(request, candidates)
            ms[label].append((time.perf_counter() - t0) * 1000)
    return {"fits": coarse.fits, "requests": len(sample), "candidates_mean": round(float(np.mean(sizes)), 1),
            "coarse_ms": {k: {"p50": round(float(np.percentile(v, 50)), 2), "p90": round(float(np.percentile(v, 90)), 2)}
                          for k, v in ms.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.coarse_ensemble", description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=Path, nargs="+", required=True, help="Trained cascades (split/, recall/, coarse/).")
    parser.add_argument("--users", type=int, default=400, help="Sampled test users timed per cascade.")
    parser.add_argument("--config", type=Path, default=None, help="The pipeline config they were trained with.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    require_cascades(args.artifacts, "run recsys train there first")
    settings = Settings.from_yaml(args.config)
    runs = {str(d): time_ensemble(d, settings, args.users) for d in args.artifacts}
    write_result(args.out, {"runs": runs}, config=args.config)


if __name__ == "__main__":
    main()
