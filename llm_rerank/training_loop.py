"""One optimisation loop for the LLM-side training jobs, with LoRA adapters (Hu et al. 2021) attached
and checkpointed the same way.

``attach_lora`` wraps a causal LM in a peft LoRA adapter; ``run_steps`` runs the steps of a
training schedule (the caller's loss per step, optional bf16 autocast, a progress bar with the
running loss, a checkpoint every ``every`` steps) and returns the loss of every step, the one
loss curve every job reports; ``save_checkpoint``/``resume`` keep the adapter, the optimiser, the
step and any extra tensors of a run so that a rerun continues where the last checkpoint left it.
Used by the re-ranker's adaptation (``llm_rerank.adapt``), the tagger's (``jobs.tagging.adapt``)
and the item-embedding projection (``jobs.tagging.embed``, a small MLP: the loop without LoRA).

Deliberately left out: building examples and losses (each job's own), multi-process training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recsys.atomic import atomic_write
from recsys.progress import progress_bar

KEEP_CHECKPOINTS = 2  # the last two: a kill while one is written leaves the other whole


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter's shape: rank, scale, dropout and the modules it wraps."""

    r: int
    alpha: int
    dropout: float
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Checkpoints:
    """Where a run's checkpoints go and how often; ``extra`` names tensors saved and restored with the
    adapter (e.g. a learnt scalar beside it), ``None`` for one a run does not have."""

    directory: Path
    every: int
    extra: dict[str, Any] = field(default_factory=dict)
    mismatch: str = "the checkpoint and this run's settings disagree"  # said when ``extra`` differs


def attach_lora(model: Any, spec: LoraSpec) -> Any:
    """``model`` wrapped in a trainable LoRA adapter (peft), in training mode."""
    from peft import LoraConfig, get_peft_model  # lazy: imports torch and transformers

    lora = LoraConfig(task_type="CAUSAL_LM", r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                      target_modules=list(spec.targets))
    wrapped = get_peft_model(model, lora)
    wrapped.train()
    return wrapped


def run_steps(optim: Any, steps: Sequence[Any], loss_of: Callable[[int, Any], Any], *, desc: str,
              progress: bool = True, autocast: bool = False, start: int = 0, model: Any = None,
              checkpoints: Checkpoints | None = None, before_step: Callable[[int], None] | None = None,
              bar: Any = None) -> list[float]:
    """Run ``steps[start:]``: per step ``loss_of(index, step)`` under bf16 autocast when ``autocast``,
    then backward and one ``optim`` step; the loss of each step run, in order.

    ``before_step(index)`` runs first (e.g. to seed dropout per step, so a resumed run repeats the
    masks); with ``checkpoints`` (and the peft ``model``), a checkpoint is saved every
    ``checkpoints.every`` steps and after the last. ``bar`` is a progress bar the caller opened
    (to write a line above it); by default one is opened here.
    """
    import torch  # lazy: heavy (torch)

    if bar is None:
        bar = progress_bar(range(start, len(steps)), desc=desc, enabled=progress, initial=start, total=len(steps))
    losses: list[float] = []
    for index in bar:
        if before_step is not None:
            before_step(index)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of(index, steps[index])
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{np.mean(losses[-10:]):.3f}")
        if checkpoints is not None and ((index + 1) % checkpoints.every == 0 or index + 1 == len(steps)):
            save_checkpoint(checkpoints, model, optim, index + 1)
    return losses


def save_checkpoint(checkpoints: Checkpoints, model: Any, optim: Any, step: int) -> None:
    """The adapter, the optimiser, ``step`` and the extra tensors, as ``step-<step>.pt``; older ones
    beyond ``KEEP_CHECKPOINTS`` are removed."""
    import torch  # lazy: heavy (torch)
    from peft import get_peft_model_state_dict  # lazy: imports torch and transformers

    directory = checkpoints.directory
    directory.mkdir(parents=True, exist_ok=True)
    state = {"adapter": get_peft_model_state_dict(model), "optimizer": optim.state_dict(), "step": step,
             **{name: None if t is None else t.detach().clone() for name, t in checkpoints.extra.items()}}
    atomic_write(directory / f"step-{step:06d}.pt", lambda fh: torch.save(state, fh))
    for old in sorted(directory.glob("step-*.pt"))[:-KEEP_CHECKPOINTS]:
        old.unlink()


def resume(checkpoints: Checkpoints, model: Any, optim: Any) -> int:
    """Load the latest checkpoint into ``model``, ``optim`` and the extra tensors (in place); the step
    to start from (0 when there is none). ``ValueError`` when the checkpoint holds other extras."""
    import torch  # lazy: heavy (torch)
    from peft import set_peft_model_state_dict  # lazy: imports torch and transformers

    found = sorted(checkpoints.directory.glob("step-*.pt"))
    if not found:
        return 0
    state = torch.load(found[-1], weights_only=False)
    if any((t is None) != (state.get(name) is None) for name, t in checkpoints.extra.items()):
        raise ValueError(f"{found[-1]}: {checkpoints.mismatch}; delete {checkpoints.directory} to start over")
    set_peft_model_state_dict(model, state["adapter"])
    optim.load_state_dict(state["optimizer"])
    with torch.no_grad():
        for name, t in checkpoints.extra.items():
            if t is not None:
                t.copy_(state[name])
    return int(state["step"])


def epoch_means(losses: Sequence[float], steps_per_epoch: int) -> list[float]:
    """The mean loss of each epoch from the loss of every step.

    >>> epoch_means([4.0, 2.0, 1.0, 0.0], 2)
    [3.0, 0.5]
    """
    return [float(np.mean(losses[i : i + steps_per_epoch])) for i in range(0, len(losses), steps_per_epoch)]
