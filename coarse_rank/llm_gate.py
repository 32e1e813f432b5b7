"""Whether a catalog's coarse ranker serves the LLM item-embedding columns (``coarse.llm_embedding_features: auto``).

With ``auto`` and LLM item embeddings at hand, ``coarse_rank.train.fit_coarse`` fits the ranker
on the same query groups without the ``LLM_EMBEDDING_FEATURES`` columns (the incumbent, what the
catalog is served without an LLM) and with them, each at ``coarse_rank.train.LLM_GATE_FITS`` seeds
(with row and column sampling, one fit's luck would decide). The fit with
them is served only when its NDCG@k, each valid group's averaged over the seeds, beats the other's
with the paired bootstrap 95% CI above zero
(``offline.protocol.gate_verdict``, the rule of the cold-item dropout, new-item placement and
fusion gates): an LLM source costs a pass of the LLM over the catalog and a wider model, and is
switched on only where it lifts beyond the run-to-run spread. Without embeddings it is off, and
the report says where they were looked for.

The LLM columns depend on the embeddings and the history only, so the incumbent's matrix is the
challenger's without them (``without_llm``): candidates and every other column are computed once.

Deliberately left out: where the embeddings come from (``jobs.tagging.embed``), the fits
(``coarse_rank.train``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coarse_rank.config import CoarseConfig
from coarse_rank.features import FeatureBuilder
from offline.protocol import gate_verdict

NO_EMBEDDINGS = "no LLM item embeddings given"


def without_llm(builder: FeatureBuilder) -> tuple[FeatureBuilder, np.ndarray]:
    """(``builder`` as fitted with ``llm_embedding_features`` false, the positions of its columns in
    ``builder``'s matrix): the same tables, the LLM columns left out."""
    config = builder.config.model_copy(update={"llm_embedding_features": False})
    base = FeatureBuilder(config, columns=(builder.score_columns, builder.flag_columns), vocab=builder.vocab,
                          tables=builder.tables, tags=builder.tags, channels=builder.channels, age=builder.age)
    names = builder.feature_names
    return base, np.array([names.index(name) for name in base.feature_names], dtype=np.int64)


def fixed_choice(config: CoarseConfig, missing: str | None = None) -> dict[str, Any]:
    """The report of a setting no gate decides: true, false, or ``auto`` without embeddings
    (``missing``: why there are none, default ``NO_EMBEDDINGS``).

    >>> fixed_choice(CoarseConfig(llm_embedding_features=False))
    {'chosen': False, 'why': 'coarse.llm_embedding_features is false'}
    >>> fixed_choice(CoarseConfig(), "no LLM item embeddings in art/tags")
    {'chosen': False, 'why': 'no LLM item embeddings in art/tags'}
    """
    setting = config.llm_embedding_features
    if setting == "auto":
        return {"chosen": False, "why": missing or NO_EMBEDDINGS}
    return {"chosen": setting, "why": f"coarse.llm_embedding_features is {str(setting).lower()}"}


def choose_llm_features(without: np.ndarray, with_llm: np.ndarray, k: int, seed: int) -> dict[str, Any]:
    """The ``auto`` verdict from each valid group's NDCG@k ``without`` and ``with_llm`` the LLM columns
    (``k`` only names the metric in the report).

    >>> choose_llm_features(np.zeros(50), np.ones(50), 10, 0)["chosen"]
    True
    >>> tie = choose_llm_features(np.ones(50), np.ones(50), 10, 0)
    >>> tie["chosen"], tie["why"][:65], tie["valid_ndcg"]
    (False, 'coarse.llm_embedding_features auto: off, the fit with them does n', {'without': 1.0, 'with': 1.0})
    """
    check = gate_verdict(without, with_llm, seed)
    wins = bool(check["wins"])
    verdict = "on, the fit with them beats" if wins else "off, the fit with them does not beat"
    return {"chosen": wins,
            "why": f"coarse.llm_embedding_features auto: {verdict} the fit without on the valid groups' NDCG@{k} "
                   "beyond the paired 95% CI",
            "valid_ndcg": {"without": round(float(without.mean()), 5), "with": round(float(with_llm.mean()), 5)},
            "gate": {key: check[key] for key in ("mean", "ci95", "p_value")}}
