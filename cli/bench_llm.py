"""``recsys bench llm``: LLM stage precision (fp32/bf16/int8), prefix KV cache, dynamic batching;
``recsys bench llm-probe``: does the backbone carry ranking signal at all (``bench.llm_backbones``);
``recsys bench llm-rerank``: the re-ranker's order against coarse's, paired per user (``jobs.evaluation.llm_rerank_eval``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer

from cli import common as c


def bench_llm(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    requests: Annotated[int, typer.Option(min=2, help="Requests per precision / cache phase.")] = 30,
    calib_requests: Annotated[int, typer.Option(min=1, help="Other users' prompts for int8 calibration.")] = 32,
    concurrency: Annotated[int, typer.Option(min=1, help="Client threads in the batching comparison.")] = 8,
    batch_requests: Annotated[int, typer.Option(min=2, help="Requests per batching run.")] = 32,
    alpha: Annotated[float, typer.Option(min=0.0, max=1.0, help="SmoothQuant migration strength.")] = 0.5,
    sections: Annotated[str, typer.Option(help="Comma-separated: precision,prefix_cache,batching.")]
    = "precision,prefix_cache,batching",
    work_dir: Annotated[Path | None, typer.Option(help="Where the int8 calibration goes (default: next to --out, "
                                                       "else /tmp/recsys-bench-llm).",
                                                  callback=c.not_dash)] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch intra-op threads.")] = None,
    out: c.OutOpt = None,
) -> None:
    """Each comparison side by side in one run, on the dataset's validation users (see bench.llm_stage)."""
    from bench.llm_stage import bench_llm as run  # lazy: keeps `recsys --help` fast

    chosen = [s.strip() for s in sections.split(",") if s.strip()]
    unknown = set(chosen) - {"precision", "prefix_cache", "batching"}
    if unknown or not chosen:
        c.fail(f"--sections takes precision, prefix_cache, batching; got {sections!r}")
    settings, art = c.trained(config, data, artifacts)
    if threads is not None:
        import torch  # lazy: heavy (torch)

        torch.set_num_threads(threads)
    work = work_dir or (out.parent / f"{out.stem}-work" if out is not None else Path("/tmp/recsys-bench-llm"))
    def partial(report: dict) -> None:  # a long run killed later still leaves its finished sections
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.with_name(f"{out.stem}.partial.json").write_text(json.dumps(report, indent=2, default=str))

    c.write_report(run(settings, art, work, requests=requests, calib_requests=calib_requests,
                       concurrency=concurrency, batch_requests=batch_requests, alpha=alpha, sections=chosen,
                       on_section=partial), out, settings=settings, data=data)


def bench_llm_probe(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    model: Annotated[list[str] | None, typer.Option(help="Backbone to probe, repeatable (side by side in one "
                                                         "report): a packaged backbone name (llm_rerank.packaged_backbones: "
                                                         "smollm2-135m-instruct, gemma3-270m, qwen2.5-coder-0.5b, "
                                                         "qwen2.5-coder-1.5b), an HF directory or hub id (default: "
                                                         "llm.model, not the adapted one).")] = None,
    train_users: Annotated[int, typer.Option(min=2, help="Train-split requests the probe is fitted on.")] = 800,
    valid_users: Annotated[int | None, typer.Option(min=2, help="Valid users measured: a random subsample drawn "
                                                                "with --seed (default: all).")] = None,
    held_only: Annotated[bool, typer.Option(help="Measure only valid users whose held item is among the "
                                                 "candidates (the others score 0 under every order).")] = False,
    seed: Annotated[int | None, typer.Option(help="Seed of the user samples and the probe (default: the "
                                                  "settings' seed).")] = None,
    candidates: Annotated[int | None, typer.Option(min=2, max=100, help="Top candidates per request "
                                                                        "(default llm.candidates).")] = None,
    min_history: Annotated[int, typer.Option(min=1, help="Probe-training users need more train items than this.")]
    = 5,
    c_reg: Annotated[float, typer.Option("--c", min=1e-6, help="Inverse L2 strength of the probe.")] = 0.01,
    threads: Annotated[int | None, typer.Option(min=1, help="torch intra-op threads.")] = None,
    include: Annotated[list[Path] | None, typer.Option(help="Earlier llm-probe reports whose backbones join this "
                                                           "report's table (e.g. a slow backbone probed on a "
                                                           "smaller sample; each row says its users).")] = None,
    out: c.OutOpt = None,
) -> None:
    """Linear probe of the backbone's answer-position state, its zero-shot, title likelihood and PMI
    scores: held item vs the stage's other top items; several --model side by side."""
    from bench.llm_backbones import compare, probe_backbone  # lazy: keeps `recsys --help` fast

    settings, art = c.trained(config, data, artifacts)
    if threads is not None:
        settings = settings.model_copy(update={"llm": settings.llm.with_overrides({"threads": threads})})
    names = list(model or [None])  # type: ignore[list-item]
    earlier = _probe_reports(include or [])
    reports: dict[str, dict] = {}
    for name in names:
        try:
            reports[name or settings.llm.model] = probe_backbone(
                settings, art, model=name, train_users=train_users, valid_users=valid_users,
                candidates=candidates, c=c_reg, seed=settings.seed if seed is None else seed, held_only=held_only,
                min_history=min_history)
        except ValueError as exc:
            c.fail(str(exc))
        if out is not None and len(names) > 1:  # a long run killed later keeps the backbones it finished
            out.parent.mkdir(parents=True, exist_ok=True)
            out.with_name(f"{out.stem}.partial.json").write_text(json.dumps(reports, indent=2, default=str))
    reports = {**earlier, **reports}
    if len(reports) == 1:
        c.write_report(next(iter(reports.values())), out, settings=settings, data=data)
    else:
        c.write_report({"table": compare(reports), "backbones": reports}, out, settings=settings, data=data)



def _probe_reports(paths: list[Path]) -> dict[str, dict]:
    """The backbones of earlier llm-probe reports (``--include``), by model; exit 2 on a file that is not one."""
    earlier: dict[str, dict] = {}
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            c.fail(f"--include {path}: not a readable llm-probe report ({exc})")
        found: dict[str, dict] | None = doc.get("backbones") if isinstance(doc, dict) else None
        if not found and isinstance(doc, dict) and "model" in doc and "ndcg@10" in doc:
            found = {doc["model"]: doc}
        if not found:
            c.fail(f"--include {path}: not an llm-probe report (no 'backbones' and no 'model'/'ndcg@10')")
        earlier.update(found or {})
    return earlier


def bench_llm_rerank(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    variant: Annotated[list[str] | None, typer.Option(help="Re-ranker to measure, repeatable: "
                                                           "MODEL/SCORING/TEXT/adapted, each part after MODEL optional: SCORING listwise or "
                                                           "pointwise, TEXT title or title_details, adapted for the LoRA weights "
                                                           "(default: llm.model/listwise/title_details); model is a "
                                                           "packaged backbone name (llm_rerank.packaged_backbones) or an HF directory.")]
    = None,
    users: Annotated[int, typer.Option(min=2, help="Users sampled (seeded); only those whose held item is among "
                                                   "the candidates reach the LLM.")] = 2000,
    phase: Annotated[Literal["test", "valid"], typer.Option(help="Held item: test or valid.")] = "test",
    candidates: Annotated[int | None, typer.Option(min=2, max=26, help="Coarse candidates re-ordered "
                                                                       "(default llm.candidates).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the user sample and the bootstrap (default: the "
                                                  "settings' seed).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch intra-op threads.")] = None,
    include: Annotated[list[Path] | None, typer.Option(help="Earlier llm-rerank reports whose variants join this "
                                                           "report (each keeps its own sample); with no --variant, "
                                                           "only merges them.")] = None,
    out: c.OutOpt = None,
) -> None:
    """Each re-ranker's order of coarse's top candidates against coarse's own, paired per user (see
    jobs.evaluation.llm_rerank_eval): NDCG@10, Recall@10, CIs, history slices, ms per request."""
    from jobs.evaluation.llm_rerank_eval import (  # lazy: keeps `recsys --help` fast
        merge_reports,
        parse_variant,
        rerank_eval,
    )

    earlier = []
    for path in include or []:
        try:
            earlier.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            c.fail(f"--include {path}: not a readable llm-rerank report ({exc})")
    settings, art = c.trained(config, data, artifacts)
    if threads is not None:
        settings = settings.model_copy(update={"llm": settings.llm.with_overrides({"threads": threads})})
    try:
        chosen = [parse_variant(v) for v in variant or ([] if earlier else [settings.llm.model])]
    except ValueError as exc:
        c.fail(str(exc))
    used_seed = settings.seed if seed is None else seed

    def partial(report: dict) -> None:  # a long run killed later keeps the variants it finished
        if out is not None:
            c.write_report(report, out.with_name(f"{out.stem}.partial.json"), settings=settings, data=data,
                           seeds=[used_seed], show=False)

    try:
        runs = [rerank_eval(settings, art, chosen, users=users, candidates=candidates, seed=used_seed,
                            phase=phase, partial=partial)] if chosen else []
        report = merge_reports([*earlier, *runs]) if earlier else runs[0]
    except ValueError as exc:
        c.fail(str(exc))
    c.write_report(report, out, settings=settings, data=data, seeds=[used_seed])
