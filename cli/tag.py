"""``recsys tag``: LLM tagging of the catalog, its adaptation, the embedding job and the ablation.

    recsys tag --data DIR --out FILE.json [--method generate|logits|embed] [--engine local|ray] [--ray-address ADDR]
    recsys tag bench-logits --data DIR --out FILE.json [--backbones smollm2-135m-instruct,gemma3-270m]
    recsys tag adapt --data DIR [--holdout 0.5] [--epochs 2]
    recsys tag embed-train --data DIR [--epochs 30]
    recsys tag merge-items --data DIR
    recsys tag ablation --data DIR --out FILE.json [--variants base,tag_features] [--retrain-coarse-tags]
    recsys tag embedding-eval --data DIR --out FILE.json [--seeds 3] [--llm-share 0.2]

Outputs live in ``<artifact_dir>/tags/`` (see ``jobs.tagging.run``). ``recsys tag`` uses the
adapted model in ``tags/model`` when ``recsys tag adapt`` has made one, else the base LLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from typer._click.core import ParameterSource  # typer (pinned) vendors click

from cli import common as c
from cli.explanations import tag_explanations
from llm_rerank.backbone import resolve_model
from llm_rerank.template import load_prompt_file
from recsys.atomic import atomic_write_text

if TYPE_CHECKING:
    from cascade.settings import Settings

tag_app = typer.Typer(help="LLM tags and embeddings for the item catalog.", invoke_without_command=True,
                      no_args_is_help=False)

ModelOpt = Annotated[Path | None, typer.Option("--model", help="HF model directory (default: tags/model, else base).")]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", min=1, help="torch threads per worker.")]


def _split(settings: Settings, data: Path | None, artifacts: Path | None) -> tuple[Any, Path]:
    from offline.split import Split  # lazy: keeps `recsys --help` fast

    root = c.artifact_dir(settings, data, artifacts)
    if not (root / "split").exists():
        c.fail(f"{root / 'split'} not found: run `recsys prepare` for this dataset first")
    return Split.load(root / "split"), root


def _model_dir(settings: Settings, root: Path, explicit: Path | None, base: bool = False) -> str:
    """The tagger's model: ``--model`` (checked here, before any job writes; ``jobs.tagging.model_dir.check_model_dir``
    then checks its config and weight files, and the model loads before a part is cleared), else ``tags/model``,
    else the base."""
    if explicit is not None:
        if not explicit.is_dir():
            c.fail(f"--model {explicit}: no such directory")
        if not (explicit / "config.json").is_file():
            c.fail(f"--model {explicit}: no config.json there (not a Hugging Face model directory)")
        return str(explicit)
    adapted = root / "tags" / "model"
    if not base and (adapted / "config.json").exists():
        return str(adapted)
    return resolve_model(settings.llm, Path(settings.artifacts_dir))


SHARED_OPTIONS = ("data", "config", "artifacts", "out", "threads")  # given before a subcommand, they apply to it


def _shared(ctx: typer.Context, **own: Any) -> tuple[Any, ...]:
    """The subcommand's ``SHARED_OPTIONS`` (``own``, in order), each given after the subcommand's name or
    before it (``recsys tag --data D merge-items``: the group's, which a subcommand ignored before);
    the same option given both ways with two values is refused."""
    group = ctx.parent.params if ctx.parent is not None else {}
    out = []
    for name, value in own.items():
        before = group.get(name)
        if value is not None and before is not None and value != before:
            c.fail(f"--{name} is given twice, {before} before `{ctx.info_name}` and {value} after it; give it once")
        out.append(value if value is not None else before)
    return tuple(out)


def _tagging_only_options(ctx: typer.Context) -> list[str]:
    """The options of tagging itself (not ``SHARED_OPTIONS``) given on the command line."""
    return [f"--{name.replace('_', '-')}" for name in ctx.params
            if name not in SHARED_OPTIONS and ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE]


@tag_app.callback()
def tag(ctx: typer.Context, data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
        out: c.OutOpt = None, model: ModelOpt = None, threads: ThreadsOpt = None,
        engine: Annotated[Literal["local", "ray"], typer.Option("--engine", help="In-process, or Ray Data actors.")] = "local",
        ray_address: Annotated[str | None, typer.Option("--ray-address", help="Existing Ray cluster.")] = None,
        ray_concurrency: Annotated[int, typer.Option("--ray-actors", min=1)] = 1,
        precision: Annotated[str, typer.Option("--precision", help="fp32 | bf16")] = "fp32",
        batch_size: Annotated[int | None, typer.Option(
            "--batch-size", min=1, help="Items per batch (default 16 for generate, 64 for logits).")] = None,
        chunk_size: Annotated[int, typer.Option("--chunk-size", min=1)] = 64,
        max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=8)] = 128,
        limit: Annotated[int | None, typer.Option("--limit", min=1, help="Tag only the first N items.")] = None,
        fresh: Annotated[bool, typer.Option("--fresh", help="Discard parts from an earlier version.")] = False,
        prompt: Annotated[Path | None, typer.Option(
            "--prompt", help="Prompt document (YAML/JSON, the schema PUT /admin/prompts takes; default "
            "llm.prompt from the config, else the built-in prompt).")] = None,
        method: Annotated[Literal["generate", "logits", "embed"], typer.Option(
            "--method", help="generate: the JSON document generated under the schema grammar; logits: closed "
            "fields from label logits (thresholds calibrated on the items outside tags/holdout.json), only "
            "free text generated (jobs.tagging.logits); embed: no tags, only the pooled hidden states of "
            "each item's llm.item_text and their 256-d projection (jobs.tagging.hidden_states).")] = "generate",
        shots: Annotated[int, typer.Option(
            "--shots", min=0, help="logits: known items shown with their genres in the cached instruction.")] = 0,
        ) -> None:
    """Tag every item of the dataset's split (resumable; rerun after a kill to continue).

    --data, --config, --artifacts, --out and --threads may also come before a subcommand's name.
    """
    if ctx.invoked_subcommand is not None:
        if given := _tagging_only_options(ctx):
            c.fail(f"{', '.join(given)} set(s) tagging itself, not `recsys tag {ctx.invoked_subcommand}`; "
                   f"see `recsys tag {ctx.invoked_subcommand} --help`")
        return
    from jobs.tagging.generate import TaggerSettings  # lazy: keeps `recsys --help` fast
    from jobs.tagging.run import TagOptions, tag_catalog  # lazy: keeps `recsys --help` fast
    from offline.split import prepared_item_noun  # lazy: keeps `recsys --help` fast

    settings = c.load_settings(config)
    try:  # checked first: resolving the model may convert a GGUF backbone (seconds, and a progress bar)
        template = load_prompt_file(prompt) if prompt is not None else settings.llm.prompt
    except ValueError as exc:
        c.fail(str(exc))
    split, root = _split(settings, data, artifacts)
    tagger = TaggerSettings(domain=prepared_item_noun(root, settings.llm.domain),
                            precision=precision, max_new_tokens=max_new_tokens, threads=threads)
    model_dir = _model_dir(settings, root, model)
    if method == "embed":
        if engine != "local":
            c.fail("--method embed runs on the local engine only")
        summary = _embed(settings, split, model_dir, root, precision=precision, threads=threads,
                         batch_size=batch_size or 32, chunk_size=chunk_size, limit=limit, fresh=fresh)
        c.write_report(summary, out)
        return
    try:
        summary = tag_catalog(split, model_dir, root, tagger, TagOptions(engine=engine,
                              chunk_size=chunk_size, batch_size=batch_size or (64 if method == "logits" else 16),
                              limit=limit, ray_address=ray_address,
                              ray_concurrency=ray_concurrency, fresh=fresh, prompt=template,
                              method=method, seed=settings.seed, shots=shots))
    except (ValueError, OSError) as exc:  # bad input, stale parts, a model that cannot load (nothing lost)
        c.fail(str(exc))
    c.write_report(summary, out)


def _embed(settings: Settings, split: Any, model_dir: str, root: Path, *, precision: str, threads: int | None,
           batch_size: int, chunk_size: int, limit: int | None, fresh: bool) -> dict[str, Any]:
    """``recsys tag --method embed``: ``jobs.tagging.hidden_states.embed_catalog`` over ``llm.item_text``."""
    from jobs.tagging.embed import EmbedSettings  # lazy: keeps `recsys --help` fast
    from jobs.tagging.hidden_states import HiddenSettings, embed_catalog  # lazy: keeps `recsys --help` fast
    from llm_rerank.item_text import item_labels  # lazy: keeps `recsys --help` fast

    texts = [str(t) for t in item_labels(split.items, settings.llm)]
    try:
        return embed_catalog(split, model_dir, root, texts, HiddenSettings(precision=precision, threads=threads),
                             embed=EmbedSettings(seed=settings.seed), chunk_size=chunk_size, batch_size=batch_size,
                             limit=limit, fresh=fresh)
    except (ValueError, OSError) as exc:  # stale parts, a model that cannot load (nothing lost)
        return c.fail(str(exc))


@tag_app.command("adapt")
def adapt(ctx: typer.Context, data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
          out: c.OutOpt = None, threads: ThreadsOpt = None,
          holdout: Annotated[float, typer.Option("--holdout", help="Share of items never trained on.")] = 0.5,
          epochs: Annotated[int, typer.Option("--epochs", min=1)] = 2,
          max_items: Annotated[int | None, typer.Option("--max-items", min=1)] = None,
          lr: Annotated[float, typer.Option("--lr")] = 1e-3) -> None:
    """LoRA-adapt the tagger on the catalog's known genres (held-out items excluded)."""
    from jobs.tagging.adapt import AdaptSettings  # lazy: keeps `recsys --help` fast
    from jobs.tagging.run import adapt_tagger_for  # lazy: keeps `recsys --help` fast

    data, config, artifacts, out, threads = _shared(ctx, data=data, config=config, artifacts=artifacts, out=out,
                                                    threads=threads)
    settings = c.load_settings(config)
    split, root = _split(settings, data, artifacts)
    cfg = AdaptSettings(epochs=epochs, lr=lr, max_items=max_items, seed=settings.seed, threads=threads)
    report = adapt_tagger_for(split, _model_dir(settings, root, None, base=True), root, cfg, holdout_fraction=holdout)
    c.write_report(report, out)


@tag_app.command("embed-train")
def embed_train(ctx: typer.Context, data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
                out: c.OutOpt = None,
                epochs: Annotated[int, typer.Option("--epochs", min=1)] = 30,
                dim: Annotated[int, typer.Option("--dim", min=8)] = 256) -> None:
    """Train the 256-d projection of the cached pooled states (InfoNCE) and build its faiss index."""
    from jobs.tagging.embed import EmbedSettings, train_embeddings  # lazy: keeps `recsys --help` fast

    data, config, artifacts, out = _shared(ctx, data=data, config=config, artifacts=artifacts, out=out)
    settings = c.load_settings(config)
    split, root = _split(settings, data, artifacts)
    try:
        report = train_embeddings(split, root / "tags", EmbedSettings(epochs=epochs, dim=dim, seed=settings.seed))
    except (ValueError, OSError) as exc:  # stale or partial tags, a failed write (the old set stays whole)
        c.fail(str(exc))
    c.write_report(report, out)


@tag_app.command("merge-items")
def merge_items(ctx: typer.Context, data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
                out: c.OutOpt = None) -> None:
    """Write tags/items.parquet: the split's items with tags merged (for rules and coarse)."""
    from jobs.tagging.wiring import write_tagged_items  # lazy: keeps `recsys --help` fast

    data, config, artifacts, out = _shared(ctx, data=data, config=config, artifacts=artifacts, out=out)
    settings = c.load_settings(config)
    split, root = _split(settings, data, artifacts)
    try:
        report = write_tagged_items(split, root / "tags")
    except (ValueError, OSError) as exc:  # tags made for another catalog, untagged items, a failed write
        c.fail(str(exc))
    c.write_report(report, out)


@tag_app.command("ablation")
def ablation(ctx: typer.Context, data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
             out: c.OutOpt = None,
             llm_share: Annotated[float, typer.Option("--llm-share", min=0.0, max=1.0)] = 0.2,
             variants: Annotated[str, typer.Option(
                 "--variants", help="Comma-separated: base, llm_channel, tagged_rules, tag_features, all.")
             ] = "base,llm_channel,tagged_rules,tag_features,all",
             retrain_coarse_tags: Annotated[bool, typer.Option(
                 "--retrain-coarse-tags", help="Retrain coarse_tags/ even when it is current.")] = False) -> None:
    """NDCG@10 and candidate recall with/without the embedding channel, tagged rules and tag features.

    The tag_features and all variants need coarse_tags/ (the coarse ranker with tag features);
    it is trained first from split/, recall_holdout/ and tags/ when missing or stale.
    """
    from jobs.tagging.ablation import run_ablation  # lazy: keeps `recsys --help` fast

    data, config, artifacts, out = _shared(ctx, data=data, config=config, artifacts=artifacts, out=out)
    settings = c.load_settings(config)
    split, root = _split(settings, data, artifacts)
    chosen = tuple(v.strip() for v in variants.split(",") if v.strip())
    try:
        report = run_ablation(settings, root, split, variants=chosen, llm_share=llm_share,
                              retrain_coarse_tags=retrain_coarse_tags)
    except (ValueError, FileNotFoundError) as exc:
        c.fail(str(exc))
    c.write_report(report, out)


@tag_app.command("embedding-eval")
def embedding_eval(ctx: typer.Context, data: c.DataOpt = None, config: c.ConfigOpt = None,
                   artifacts: c.ArtifactsOpt = None, out: c.OutOpt = None,
                   seeds: Annotated[int, typer.Option("--seeds", min=1, max=10,
                                                      help="Coarse seeds s, s+1, ... (s = the config's seed).")] = 3,
                   llm_share: Annotated[float, typer.Option("--llm-share", min=0.0, max=1.0)] = 0.2,
                   include: Annotated[list[Path] | None, typer.Option(
                       help="Reports of earlier runs (other seeds, same split and recall fit) joined into this "
                       "one.")] = None) -> None:
    """The LLM item embeddings as a recall channel and as coarse features, each alone against the cascade
    without them: one recall fit, a coarse ranker per seed and variant (jobs.tagging.embedding_eval).

    Needs tags/embed (`recsys tag --method embed`); trains the two-towers first when they are missing.
    """
    from jobs.tagging.embedding_eval import embedding_report, merge_reports  # lazy: keeps --help fast

    data, config, artifacts, out = _shared(ctx, data=data, config=config, artifacts=artifacts, out=out)
    settings = c.load_settings(config)
    split, root = _split(settings, data, artifacts)
    chosen = tuple(range(settings.seed, settings.seed + seeds))
    earlier = []
    for path in include or []:
        try:
            earlier.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            c.fail(f"--include {path}: not a readable report ({exc})")
    try:
        report = merge_reports(embedding_report(settings, root, split, seeds=chosen, llm_share=llm_share), earlier)
    except (ValueError, OSError, KeyError) as exc:  # no embeddings, a directory in the way, a foreign report
        c.fail(str(exc))
    c.write_report(report, out, settings=settings, data=data, seeds=report["seeds"])


@tag_app.command("cold-items")
def cold_items(ctx: typer.Context, data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
               out: c.OutOpt = None,
               share: Annotated[float, typer.Option("--share", min=0.01, max=0.5,
                                                    help="Share of items made new by the cutoff.")] = 0.1,
               llm_share: Annotated[float, typer.Option("--llm-share", min=0.0, max=1.0)] = 0.2,
               variants: Annotated[str, typer.Option(
                   "--variants", help="Comma-separated: none, text, llm_tags, llm_embedding, text+llm_tags, "
                   "text+llm_embedding, text+llm_rerank (the LLM re-ranker on the LLM path; seconds per request, "
                   "so not in the default list).")
               ] = "none,text,llm_tags,llm_embedding,text+llm_tags,text+llm_embedding",
               rerank_users: Annotated[int, typer.Option(
                   "--rerank-users", min=10, help="text+llm_rerank: valid users its fusion gate is fitted on, and "
                   "warm-item test users measured beside every cold-item user (seeded samples).")] = 150,
               ) -> None:
    """The cold-item slice with each item-side source alone: text, LLM tags, LLM embedding (jobs.evaluation.cold_sources).

    Tags the cold split's catalog by logits and trains the embedding projection first (new items'
    labels and interactions kept out), then a two-tower with and one without text.
    """
    from jobs.evaluation.cold_sources import cold_source_report  # lazy: keeps `recsys --help` fast

    data, config, artifacts, out = _shared(ctx, data=data, config=config, artifacts=artifacts, out=out)
    settings = c.load_settings(config)
    split, root = _split(settings, data, artifacts)
    chosen = tuple(v.strip() for v in variants.split(",") if v.strip())
    if not chosen:
        c.fail("--variants names no variant; choose from none, text, llm_tags, llm_embedding, text+llm_tags, "
               "text+llm_embedding, text+llm_rerank")
    try:
        report = cold_source_report(settings, root, split, share=share, variants=chosen, llm_share=llm_share,
                                    rerank_users=rerank_users)
    except (ValueError, FileNotFoundError) as exc:
        c.fail(str(exc))
    c.write_report(report, out)


@tag_app.command("bench-logits")
def bench_logits(ctx: typer.Context, data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
                 out: c.OutOpt = None, threads: ThreadsOpt = None,
                 backbones: Annotated[str, typer.Option(
                     "--backbones", help="Comma-separated packaged backbone names or model directories tagged by logits.")
                 ] = "smollm2-135m-instruct,gemma3-270m",
                 generation_model: Annotated[str, typer.Option(
                     "--generation-model", help="Backbone of the generation-path row ('' to skip it).")
                 ] = "smollm2-135m-instruct",
                 generation_sample: Annotated[int, typer.Option("--generation-sample", min=1)] = 40,
                 batch_size: Annotated[int, typer.Option(
                     "--batch-size", min=1, help="Items per batched pass of the logits rows.")] = 64,
                 generation_batch_size: Annotated[int, typer.Option(
                     "--generation-batch-size", min=1, help="Items per generate() call of the generation row.")] = 16,
                 shots: Annotated[int, typer.Option("--shots", min=0)] = 0,
                 max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=8)] = 128) -> None:
    """Logits tagging of the whole catalog per backbone beside the generation path, in one run."""
    from bench.tagging_logits import compare_taggers  # lazy: keeps `recsys --help` fast
    from jobs.tagging.generate import TaggerSettings  # lazy: keeps `recsys --help` fast
    from offline.loaders import load_dataset  # lazy: keeps `recsys --help` fast
    from offline.split import prepared_item_noun  # lazy: keeps `recsys --help` fast

    data, config, artifacts, out, threads = _shared(ctx, data=data, config=config, artifacts=artifacts, out=out,
                                                    threads=threads)
    settings = c.load_settings(config)
    split, root = _split(settings, data, artifacts)
    if data is None:
        c.fail("--data is required: the whole catalog is read from the dataset directory")

    def located(name: str) -> str:
        return resolve_model(settings.llm.model_copy(update={"model": name}), Path(settings.artifacts_dir))

    try:
        catalog = load_dataset(data).items
        models = {name: located(name) for name in (b.strip() for b in backbones.split(",")) if name}
        report = compare_taggers(split.items, catalog, models, located(generation_model) if generation_model else None,
                                 generation_sample=generation_sample, seed=settings.seed, batch_size=batch_size,
                                 generation_batch_size=generation_batch_size,
                                 shots=shots, checkpoint=lambda partial: _write_quietly(partial, out),
                                 settings=TaggerSettings(domain=prepared_item_noun(root, settings.llm.domain),
                                                         precision="fp32",
                                                         max_new_tokens=max_new_tokens, threads=threads))
    except (ValueError, FileNotFoundError) as exc:
        c.fail(str(exc))
    c.write_report(report, out)


def _write_quietly(report: dict[str, Any], out: Path | None) -> None:
    """The report so far, written atomically to ``out`` (when given) without printing it."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps({**report, "partial": True}, indent=2, default=str) + "\n")


tag_app.command("explanations")(tag_explanations)  # listed after this module's own commands
