"""The training report's fit summary and warnings (jobs.evaluation.fit_report)."""

from __future__ import annotations

import json

from cascade.settings import Settings
from jobs.evaluation.fit_report import served_choices, training_warnings


def test_a_two_tower_stopped_by_the_clock_or_by_the_budget_before_early_stopping_is_a_warning() -> None:
    settings = Settings.build({"recall": {"max_train_s": 1800, "max_train_logits": 1e10}})
    clocked = {"epochs": 14, "best_epoch": 10, "out_of_time": True, "out_of_budget": False}
    warnings = training_warnings(settings, {"recall": clocked, "coarse": {"seconds": 1.0}})
    # the clock, not the budget: machine-dependent even past the best epoch (patience might have run on)
    assert len(warnings) == 1 and warnings[0].startswith("recall: the wall-clock cap recall.max_train_s (1800 s) "
                                                         "stopped the two-tower at epoch 14")
    budget = {"epochs": 6, "best_epoch": 6, "out_of_time": False, "out_of_budget": True}
    warnings = training_warnings(settings, {"recall_holdout": budget})
    assert len(warnings) == 1 and "recall.max_train_logits (1e+10) stopped the two-tower at epoch 6 while" in warnings[0]
    # the budget after the best epoch had passed but before patience ran out: still not converged
    (warning,) = training_warnings(settings, {"recall": {**budget, "best_epoch": 4}})
    assert "at epoch 6 before early stopping (best epoch 4): not converged" in warning
    # early stopping: nothing to say
    assert training_warnings(settings, {"recall": {**budget, "out_of_budget": False}}) == []
    # the refit (recall.refit) has no budget, only the clock
    refit = {"epochs": 20, "best_epoch": 12, "out_of_time": False, "out_of_budget": False,
             "refit": {"epochs": 7, "out_of_time": True}}
    warnings = training_warnings(settings, {"recall": refit})
    assert len(warnings) == 1 and "stopped the refit at epoch 7 of 12" in warnings[0]
    assert training_warnings(settings, {"recall": {**refit, "refit": {"epochs": 12, "out_of_time": False}}}) == []


def test_a_two_tower_stopped_by_its_epoch_bound_is_a_warning_that_names_the_bound() -> None:
    settings = Settings.build({})
    bounded = {"epochs": 200, "best_epoch": 196, "stopped_by": "max_epochs", "converged": False, "out_of_time": False,
               "out_of_budget": True, "settings": {"max_epochs": "200 (scaled: 20,000 steps / 500 steps per epoch, "
                                                                 "at least 200)"}}
    (warning,) = training_warnings(settings, {"recall": bounded})
    assert warning.startswith("recall: the epoch bound recall.max_epochs (200 (scaled: 20,000 steps") and (
        "at epoch 200 before early stopping (best epoch 196): not converged" in warning)
    converged = {**bounded, "stopped_by": "early_stopping", "converged": True, "out_of_budget": False}
    assert training_warnings(settings, {"recall": converged}) == []


def test_the_served_choices_are_read_from_the_trained_cascade(tiny_cascade, tmp_path) -> None:
    art, settings = tiny_cascade
    choices = served_choices(settings, art)
    coarse = json.loads((art / "coarse" / "meta.json").read_text())["report"]
    assert choices["coarse"] == {"cold_item_training": coarse["cold_item_dropout"]["chosen"],
                                 "new_items": coarse["new_items"]["chosen"],
                                 "llm_columns": coarse["llm_embedding_features"]["chosen"], "ensemble": 3}
    assert choices["fusion"]["weights"] and choices["fusion"]["kept"]
    assert served_choices(settings, tmp_path) == {}  # nothing trained there: nothing to say
