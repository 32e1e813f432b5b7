"""Entry points behind ``recsys tag``: tag a split's catalog, and adapt the tagger first.

``tag_catalog`` builds the concrete schema from the catalog's categories, versions the job,
resumes whatever parts exist, runs the chosen engine, finalises the table and returns the
summary (items, seconds, items/s, schema-valid rate, fallbacks, genre F1 on all items and on
the items held out of adaptation). Layout under ``<artifact_dir>/tags/``: ``parts/``,
``manifest.json``, ``tags.parquet``, ``hidden.npy``, ``version.json``, ``summary.json``. The
model is checked (``jobs.tagging.model_dir``) and loaded in this process before the job clears or
writes any part (``job.plan`` then ``job.start``), on the Ray engine too, so a model directory
that cannot load is one error and costs no finished part; a ``limit`` run writes no table until
the parts cover the whole catalog (``job.finalize``).

``adapt_tagger_for`` writes the adapted model to ``tags/model/`` with the held-out item list
inside it (``tags/model/holdout.json``, swapped in with the weights as one set), then copies
that list to ``tags/holdout.json``. A tagging run with an adapted model reads the model's own
list (``current_holdout``), so an adaptation that dies half-way, or a copy that never
happened, never scores items the model was trained on as held out.

``tag_catalog(prompt=...)`` takes the prompt document the re-ranker serves
(``llm_rerank.template``: ``llm.prompt`` in the config, a file through ``load_prompt_file``, or
the document of an active ``/admin/prompts`` version); its ``tagging_system`` and
``tagging_request`` change what the tagger sees, and the job version with them.

``tag_catalog(method="logits")`` reads the closed fields from label logits and generates only
the free text (``jobs.tagging.logits``), calibrating thresholds on the items outside
``tags/holdout.json`` (written here when absent, with the adaptation job's fraction and seed).

Deliberately left out: embedding training (``jobs.tagging.embed``), wiring into stages
(``jobs.tagging.wiring``); adapted models from before the held-out list moved into the model
directory (``tags/holdout.json`` is trusted for them, as it was).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from jobs.tagging.adapt import AdaptSettings, adapt_tagger
from jobs.tagging.catalog import catalog_digest
from jobs.tagging.generate import Tagger, TaggerSettings
from jobs.tagging.job import (
    TagJob,
    finalize,
    item_rows,
    job_version,
    plan,
    run_local,
    start,
    write_manifest,
    write_part,
)
from jobs.tagging.label_prompt import LABEL_PROMPT_VERSION
from jobs.tagging.logits import LogitTagger, tag_items
from jobs.tagging.model_dir import check_model_dir, load_or_refuse
from jobs.tagging.parts import part_items
from jobs.tagging.quality import genre_f1, holdout_items
from jobs.tagging.ray_engine import run_ray
from jobs.tagging.schema import catalog_categories, concrete_schema
from jobs.tagging.staging import staged_dir
from llm_rerank.template import DEFAULT, PromptTemplate
from recsys.atomic import atomic_write_json

log = logging.getLogger(__name__)

Engine = Literal["local", "ray"]
Method = Literal["generate", "logits"]
HOLDOUT_FRACTION = 0.5  # the share of items held out of adaptation and calibration (results/tagging/generate_adapted_ml100k.json)
HOLDOUT_FILE = "holdout.json"


def tags_dir(artifact_dir: Path) -> Path:
    return Path(artifact_dir) / "tags"


def adapt_tagger_for(split: Any, base_dir: str, artifact_dir: Path, settings: AdaptSettings, *,
                     holdout_fraction: float = 0.5, domain: str = "movie", progress: bool = True) -> dict[str, Any]:
    """Hold out a random fraction of the catalog, LoRA-adapt on the rest, save to ``tags/model``
    (the held-out list inside it), then copy the list to ``tags/holdout.json``."""
    out = tags_dir(artifact_dir)
    out.mkdir(parents=True, exist_ok=True)
    held = holdout_items(len(split.items), holdout_fraction, settings.seed)
    record = {"fraction": holdout_fraction, "seed": settings.seed, "items": held.tolist(),
              "catalog": catalog_digest(split.items["item_id"])}
    categories = catalog_categories(split.items["categories"])
    report = adapt_tagger(base_dir, split.items, categories, held, out / "model", settings, domain, progress,
                          holdout=record)
    atomic_write_json(out / HOLDOUT_FILE, record, indent=None)
    return report


def current_holdout(split: Any, out: Path, model_dir: str | None) -> np.ndarray | None:
    """The items held out of ``model_dir``'s adaptation when it is an adapted model that lists them
    (``tags/holdout.json`` is brought in line with that list), else ``tags/holdout.json`` if there
    is one, else None."""
    path = Path(out) / HOLDOUT_FILE
    own = Path(model_dir) / HOLDOUT_FILE if model_dir is not None else None
    if own is not None and own.is_file():
        record = json.loads(own.read_text())
        if record.get("catalog", catalog_digest(split.items["item_id"])) != catalog_digest(split.items["item_id"]):
            raise ValueError(f"{own}: the model was adapted on another catalog (the split was prepared again), so "
                             "its held-out items are not this split's: re-run `recsys tag adapt`, or tag with "
                             "another --model")
        if not path.is_file() or json.loads(path.read_text()) != record:
            atomic_write_json(path, record, indent=None)  # an adaptation that stopped before its copy
        return np.asarray(record["items"], dtype=np.int64)
    if path.is_file():
        return np.asarray(json.loads(path.read_text())["items"], dtype=np.int64)
    return None


def heldout_for(split: Any, out: Path, seed: int, model_dir: str | None = None) -> np.ndarray:
    """The items held out of adaptation and calibration: ``current_holdout`` when there is one, else
    ``quality.holdout_items`` with the same fraction and seed, written to ``tags/holdout.json`` so
    later runs and the adaptation job share it."""
    held = current_holdout(split, out, model_dir)
    if held is not None:
        return held
    held = holdout_items(len(split.items), HOLDOUT_FRACTION, seed)
    atomic_write_json(Path(out) / HOLDOUT_FILE, {"fraction": HOLDOUT_FRACTION, "seed": seed, "items": held.tolist()},
                      indent=None)
    return held


@dataclass(frozen=True)
class TagOptions:
    """How one tagging run goes: the method, the engine and its parallelism, the chunking, a limit.

    ``limit`` tags the first rows only; ``fresh`` clears the parts first; ``prompt`` is the prompt
    document the re-ranker serves (default ``llm_rerank.template.DEFAULT``); ``seed`` draws the
    held-out items and the few-shot examples (``shots``, logits only).
    """

    method: Method = "generate"
    engine: Engine = "local"
    chunk_size: int = 64
    batch_size: int = 16
    limit: int | None = None
    ray_address: str | None = None
    ray_concurrency: int = 1
    ray_cpus: int = 2
    fresh: bool = False
    progress: bool = True
    prompt: PromptTemplate | None = None
    seed: int = 42
    shots: int = 0

    def __post_init__(self) -> None:
        if self.method not in ("generate", "logits"):
            raise ValueError(f"method must be 'generate' or 'logits', got {self.method!r}")
        if self.engine not in ("local", "ray"):
            raise ValueError(f"engine must be 'local' or 'ray', got {self.engine!r}")
        if self.method == "logits" and self.engine != "local":
            raise ValueError(f"method 'logits' runs on the local engine only, got engine={self.engine!r}")


def tag_catalog(split: Any, model_dir: str, artifact_dir: Path, settings: TaggerSettings,
                options: TagOptions | None = None) -> dict[str, Any]:
    """Tag ``split.items`` (first ``options.limit`` rows if given) with ``model_dir``; the summary dict.

    ``method="logits"`` (``jobs.tagging.logits``) scores closed fields from label logits and
    generates only free text; it calibrates on the items outside ``heldout_for`` and always
    retags every item of the run (its thresholds need all of them), replacing the parts on disk
    as one set once it has them; it refuses a ``limit`` that would replace parts past it.
    """
    opts = options or TagOptions()
    template = opts.prompt or DEFAULT
    method, engine, seed, progress = opts.method, opts.engine, opts.seed, opts.progress
    chunk_size, batch_size = opts.chunk_size, opts.batch_size
    check_model_dir(model_dir)
    categories = catalog_categories(split.items["categories"])
    schema = concrete_schema(categories)
    out = tags_dir(artifact_dir)
    out.mkdir(parents=True, exist_ok=True)
    version = job_version(model_dir, schema, settings, chunk_size, batch_size, split.items["item_id"], template,
                          items=split.items)
    if method == "logits":
        version.update({"method": "logits", "label_prompt_version": LABEL_PROMPT_VERSION, "shots": opts.shots})
    job = TagJob(out, split.items, version, chunk_size, batch_size, opts.limit)
    held: np.ndarray | None  # read before any tagging: a model adapted on another catalog is refused first
    if method == "logits":
        _refuse_a_limit_that_replaces_more(job, opts.fresh)
        held = heldout_for(split, out, seed, model_dir)
        t0 = time.perf_counter()
        n_tagged, extra = job.stop, _tag_logits(job, model_dir, schema, settings, template, held, seed, opts.shots,
                                                progress)
    else:
        held = current_holdout(split, out, model_dir)
        t0 = time.perf_counter()
        n_tagged, extra = _tag_generate(job, model_dir, schema, settings, template, opts.fresh, progress,
                                        engine=engine, address=opts.ray_address, concurrency=opts.ray_concurrency,
                                        num_cpus=opts.ray_cpus)
    seconds = time.perf_counter() - t0
    frame = finalize(job)
    summary = summarise(frame, split.items.iloc[: len(frame)], categories, held, seconds, n_tagged)
    summary.update({"engine": engine, "method": method, **extra, "catalog_items": len(split.items),
                    "table_written": len(frame) == len(split.items), "version": job.version, "out_dir": str(out)})
    if not summary["table_written"]:
        log.warning("note: %s: the parts cover items 0..%d of %d; tags.parquet is written once they cover every "
                    "item (run `recsys tag` without --limit)", job.parts, len(frame) - 1, len(split.items))
    atomic_write_json(out / "summary.json", summary, default=str)
    return summary


def _tag_generate(job: TagJob, model_dir: str, schema: dict[str, Any], settings: TaggerSettings,
                  template: PromptTemplate, fresh: bool, progress: bool, *, engine: Engine, address: str | None,
                  concurrency: int, num_cpus: int) -> tuple[int, dict[str, Any]]:
    """Tag the chunks ``plan`` finds undone, the model loaded here before ``start`` clears or removes
    any part, on either engine (Ray's actors load it again: loading it once in this process first is
    what keeps a model that cannot load from costing the parts a ``fresh`` run would clear, and turns
    its failure into one error instead of a dead actor); (items tagged, what the summary adds)."""
    pending, damaged = plan(job, fresh)
    for chunk, why in damaged.items():
        log.warning("note: %s %s: removed, and redone by a run over its items", job.part_path(chunk), why)
    tagger = load_or_refuse(Tagger(model_dir, schema, settings, template), model_dir) if pending else None
    start(job, fresh, damaged)
    if tagger is not None and engine == "local":
        run_local(job, tagger.tag_batch, pending, progress)
    elif pending:
        del tagger  # the actors load their own copies
        run_ray(job, model_dir, schema, settings, pending, address=address, concurrency=concurrency,
                num_cpus=num_cpus, progress=progress, template=template)
    extra = {"damaged_parts": {job.part_path(c).name: why for c, why in damaged.items()}} if damaged else {}
    return sum(len(job.chunk_items(c)) for c in pending), extra


def _refuse_a_limit_that_replaces_more(job: TagJob, fresh: bool) -> None:
    """A logits run replaces every part: with a ``limit``, refuse while parts past it are on disk (unless ``fresh``)."""
    beyond = _parts_past_the_run(job)
    if beyond and not fresh:
        raise ValueError(f"{job.parts}: {beyond} there hold tags past item {job.stop - 1}; a --method logits run "
                         f"retags only its --limit {job.limit} items and replaces every part (their thresholds "
                         "are calibrated together), so those would be lost: rerun without --limit, or with "
                         "--fresh to discard them")


def _tag_logits(job: TagJob, model_dir: str, schema: dict[str, Any], settings: TaggerSettings,
                template: PromptTemplate, held: np.ndarray, seed: int, shots: int, progress: bool) -> dict[str, Any]:
    """Tag every item of the run by label logits (calibrated outside ``held``), then swap its parts in
    for those on disk as one set; thresholds and phase timings."""
    cats, skip = job.items["categories"], set(held.tolist())
    known = {i: [str(c) for c in cats.iloc[i]] for i in range(job.stop) if i not in skip and len(cats.iloc[i])}
    tagger = load_or_refuse(LogitTagger(model_dir, schema, settings, template), model_dir)
    rows = item_rows(job.items, job.version["categories"], 0, job.stop)
    run = tag_items(tagger, rows, known, batch_size=job.batch_size, shots=shots, seed=seed, progress=progress)
    with staged_dir(job.parts) as parts:
        for chunk in range(job.n_chunks):
            write_part(job, chunk, run.results[chunk * job.chunk_size : (chunk + 1) * job.chunk_size], parts)
        write_manifest(job, parts)  # before the swap: a kill between leaves old parts under a manifest refusing them
    return {"thresholds": {name: t.as_dict(list(f.values)) for f, (name, t) in
                           zip(tagger.fields, run.thresholds.items(), strict=True)},
            "phase_seconds": run.seconds, "calibrated_on_items": len(known), "shots": shots}


def _parts_past_the_run(job: TagJob) -> str:
    """The part files on disk that hold items past ``job.stop`` (named for the error), or ''."""
    last = job.n_chunks - 1
    names = [job.part_path(c).name for c in range(job.n_chunks, job.catalog_chunks) if job.part_path(c).exists()]
    if (part_items(job.part_path(last)) or 0) > len(job.chunk_items(last)):
        names.insert(0, job.part_path(last).name)
    return ", ".join(names)


def summarise(frame: Any, items: Any, categories: list[str], held: np.ndarray | None, seconds: float,
              n_tagged_now: int) -> dict[str, Any]:
    """Counts, speed and genre F1 (all items, and the adaptation hold-out ``held`` when there is one)."""
    predicted = [list(g) for g in frame["genres"]]
    truth = [list(c) for c in items["categories"]]
    fallbacks = int(frame["fallback"].sum())
    summary: dict[str, Any] = {
        "items": len(frame), "items_tagged_this_run": n_tagged_now, "seconds": seconds,
        "items_per_s": n_tagged_now / seconds if seconds > 0 and n_tagged_now else None,
        "new_tokens_mean": float(frame["new_tokens"].mean()),
        "schema_valid_rate": float((~frame["fallback"]).mean()), "fallbacks": fallbacks,
        "retried": int((frame["attempts"] > 1).sum()),
    }
    overall = genre_f1(predicted, truth, categories)
    summary.update({"genre_f1_micro": overall["micro"], "genre_f1_macro": overall["macro"]})
    if held is not None:
        held = held[held < len(frame)]
        trained = np.setdiff1d(np.arange(len(frame)), held)
        for name, idx in (("heldout", held), ("adapted_on", trained)):
            f1 = genre_f1([predicted[i] for i in idx], [truth[i] for i in idx], categories)
            summary.update({f"genre_f1_micro_{name}": f1["micro"], f"genre_f1_macro_{name}": f1["macro"],
                            f"items_{name}": len(idx)})
    return summary
