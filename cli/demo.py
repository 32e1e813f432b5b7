"""``recsys demo``: the whole system end to end on the embedded synthetic default.

Generates the synthetic catalog, trains recall, coarse ranker and fusion (reused on a second
run), then shows the LLM re-ranker (the real SmolLM2, zero-shot on this catalog):

- in process, one ``serving.service.Recommender`` with the LLM stage on (the server's own
  answer code, without HTTP) tunes the fusion gate for ``recall+coarse+llm`` on a sample of
  ``GATE_USERS`` valid users (``jobs.evaluation.evaluate``'s check: the LLM's order or a mixture is served
  only if it beats coarse's with a CI above zero; reused on a second run), then answers
  one request with the LLM stage's budget cut to ``CUT_BUDGET_MS``: the stage gives up and
  the cascade serves the coarse order, marked ``fallback``;
- the HTTP server, LLM stage loaded, answers a known user on the light path, an unknown
  user, then the known user twice with ``llm: true`` (the second with another ``context``,
  so the result cache cannot answer): the LLM stage's time, the prefix-cache blocks each
  call found (``/metrics``), and the fusion gate's decision on the order served.

Deliberately left out: LLM adaptation (``recsys train llm``; minutes on 2 cores) and the
gate over every valid user (``recsys train`` with ``configs/pipeline_llm.yaml``).
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import typer
from pydantic import SecretStr

from cascade.registry import RECALL_KINDS, build_stage, load_stage, weights_key
from cascade.settings import Settings
from fusion.stage import WEIGHTS_FILE, save_weights
from jobs.evaluation.cascade_run import requests_for
from jobs.fusion_gate import fit_gate
from jobs.prepare import prepare
from jobs.train import train_stages
from recsys.manifest import write_manifest
from recsys.pipeline import Pipeline
from serving.metrics import llm_cache_counts
from serving.schemas import RecommendRequest
from serving.server_process import start_server_subprocess
from serving.service import Recommender

# bound each two-tower fit so `make demo` stays within minutes on 2 cores, by the deterministic logit
# budget (not the clock: the same seed gives the same demo model on a busy or a slow machine). The
# default synthetic data's fits stop early after 4.5e8 and 7.4e8 logits (35-41 s here); this is ~2x that.
DEMO_RECALL_MAX_LOGITS = 1.5e9
GATE_USERS = 40  # valid users the demo's fusion gate is tuned on: ~25 s of zero-shot SmolLM2 on 2 cores
CUT_BUDGET_MS = 1.0  # the LLM stage budget of the fallback request: far below one forward pass


def run_demo(settings: Settings, artifact_dir: Path, config: Path | None, users: int, items: int) -> None:
    t0 = time.perf_counter()
    typer.secho(f"[1/4] preparing synthetic data in {artifact_dir}", bold=True)
    split = prepare(None, artifact_dir, n_users=users, n_items=items, seed=settings.seed)
    typer.echo(f"      {split.n_users} users, {split.n_items} items, {len(split.train)} training interactions")
    typer.secho("[2/4] training recall -> coarse ranker -> fusion (reused when present)", bold=True)
    settings = demo_recall_budget(settings)
    report = train_stages(settings, artifact_dir, split)
    for stage, rep in report.items():
        typer.echo(f"      {stage}: " + ("reused" if rep.get("reused") else f"{rep.get('seconds')} s"))
    with_llm = llm_enabled(settings)
    typer.secho(f"[3/4] LLM re-ranker in process ({with_llm.llm.model}, zero-shot): fusion gate, budget cut",
                bold=True)
    known = str(split.vocab.user_ids[0])
    gate = llm_in_process(with_llm, artifact_dir, split, known)
    typer.secho("[4/4] serving over HTTP (LLM stage loaded) and asking for recommendations", bold=True)
    serve_and_ask(with_llm, artifact_dir, known, str(split.vocab.user_ids[1]), gate)
    typer.secho(f"\ndemo finished in {time.perf_counter() - t0:.0f} s", bold=True)


def demo_recall_budget(settings: Settings) -> Settings:
    """``settings`` with each two-tower fit bounded by at most ``DEMO_RECALL_MAX_LOGITS`` logits
    (a smaller configured budget is kept; the wall-clock safety cap is left as configured)."""
    budget = min(settings.recall.max_train_logits or DEMO_RECALL_MAX_LOGITS, DEMO_RECALL_MAX_LOGITS)
    return settings.model_copy(update={"recall": settings.recall.model_copy(update={"max_train_logits": budget})})


def llm_enabled(settings: Settings) -> Settings:
    """``settings`` with the configured LLM stage switched on (traffic share unchanged: requests opt in)."""
    stages = [s.model_copy(update={"enabled": True}) if s.kind == "llm" else s for s in settings.pipeline.stages]
    if not any(s.kind == "llm" for s in stages):
        raise ValueError("the demo's pipeline config has no stage of kind 'llm' to switch on")
    return settings.model_copy(update={"pipeline": settings.pipeline.model_copy(update={"stages": stages})})


def llm_in_process(settings: Settings, artifact_dir: Path, split: Any, user: str) -> dict[str, Any]:
    """Tune (or reuse) the fusion gate with the LLM on, then one request with the LLM budget cut."""
    t0 = time.perf_counter()
    rec = Recommender.load(settings, artifact_dir)
    typer.echo(f"      LLM pipeline loaded in {time.perf_counter() - t0:.1f} s")
    gate = tune_gate(rec, settings, artifact_dir, split)
    reused = "reused" if gate.get("reused") else f"tuned in {gate['seconds']:.0f} s"
    typer.echo(f"      fusion gate for {gate['key']} ({reused}, {gate['valid_users']} valid users, "
               f"{gate.get('llm_scored_users', gate['valid_users'])} scored by the LLM): serves "
               f"{gate['weights']}; {gate['mixture_check'].get('kept', '')}")
    singles = ", ".join(f"{s} {v:.3f}" for s, v in gate["single_stage_valid_ndcg"].items())
    typer.echo(f"      valid NDCG@10 of each stage alone: {singles}")
    cut = cut_llm_budget(rec, settings)
    answer = cut.recommend(RecommendRequest(user_id=user, k=5, llm=True))
    llm = next(s for s in answer["stages"] if s["name"] == "llm")
    typer.secho(f"\n  LLM budget cut to {CUT_BUDGET_MS:g} ms, user_id={user!r} (in process, same answer code as "
                "the server):", fg=typer.colors.YELLOW)
    typer.echo(f"    path={answer['path']} fallbacks={answer['fallbacks']} llm stage: {llm['status']} after "
               f"{llm['ms']:.1f} ms ({llm['reason']})")
    typer.echo("    served (the order before the LLM, through rules and fusion): "
               + ", ".join(i["title"] for i in answer["items"]))
    return gate


def cut_llm_budget(rec: Any, settings: Settings) -> Any:
    """A ``Recommender`` over the same loaded stages whose LLM stage has ``CUT_BUDGET_MS`` to answer."""
    return with_llm_budget(rec, settings, CUT_BUDGET_MS)


def with_llm_budget(rec: Any, settings: Settings, budget_ms: float | None) -> Any:
    """A ``Recommender`` over ``rec``'s loaded stages with the LLM stage's ``budget_ms`` replaced."""
    def budget(spec: Any) -> Any:
        return spec.model_copy(update={"budget_ms": budget_ms}) if spec.kind == "llm" else spec

    stages = [budget(s) for s in settings.pipeline.stages]
    new_settings = settings.model_copy(update={"pipeline": settings.pipeline.model_copy(update={"stages": stages})})
    # no LLM budget (offline tuning) means no request deadline either: required stages after the LLM
    # would fail a request whose deadline the LLM used up
    request_budget_ms = None if budget_ms is None else rec.pipeline.request_budget_ms
    pipeline = Pipeline([(budget(spec), stage) for spec, stage in rec.pipeline.stages],
                        request_budget_ms=request_budget_ms)
    return Recommender(new_settings, rec.catalog, pipeline)


def tune_gate(rec: Any, settings: Settings, artifact_dir: Path, split: Any) -> dict[str, Any]:
    """The fusion gate for this stage set, tuned on ``GATE_USERS`` valid users unless already saved.

    ``jobs.fusion_gate.fit_gate``, as ``tune_fusion`` does over every valid user (~6 minutes of
    SmolLM2 here), on a seeded sample; the weights land where the server's fusion stage looks.
    """
    key = weights_key(settings)
    path = artifact_dir / "fusion" / key / WEIGHTS_FILE
    if path.exists():
        return {**json.loads(path.read_text()), "key": key, "reused": True}
    t0 = time.perf_counter()
    # offline tuning waits for every LLM answer: a serving budget missed on a busy machine would
    # leave the LLM column out (and the abandoned calls would slow the next ones down)
    served = with_llm_budget(rec, settings, None).pipeline
    # the valid phase's recall model: the served one (refit) has learnt the valid items tuned on
    pipeline = Pipeline([(spec, load_stage(spec, build_stage(spec, settings), artifact_dir, "valid")
                          if spec.enabled and spec.kind in RECALL_KINDS else stage) for spec, stage in served.stages],
                        request_budget_ms=served.request_budget_ms)
    rng = np.random.default_rng(settings.seed)
    sample = set(rng.choice(split.n_users, min(GATE_USERS, split.n_users), replace=False).tolist())
    requests = [r for r in requests_for(split, "valid") if r.user_idx in sample]
    gate = fit_gate(pipeline, split, requests, settings)
    weights = gate["weights"]
    scored = sum(1 for c in gate["captured"] if "llm" in c.scores and not np.isnan(c.scores["llm"]).all())
    meta = {"single_stage_valid_ndcg": gate["single_stage_valid_ndcg"], "grid_best": gate["grid_best"],
            "mixture_check": gate["mixture_check"], "valid_users": len(requests), "llm_scored_users": scored,
            "tuned_by": f"recsys demo: {GATE_USERS} sampled valid users"}
    save_weights(path.parent, weights, valid_ndcg_at_10=gate["valid_ndcg@10"], **meta)
    write_manifest(path.parent)  # the digest the fusion stage's load checks (recsys.manifest)
    for spec, stage in pipeline.stages:
        if spec.kind == "fusion":
            stage.load(artifact_dir)  # serve the gate just tuned
    return {"weights": weights, **meta, "key": key, "seconds": time.perf_counter() - t0}


def with_debug_key(settings: Settings) -> tuple[Settings, str]:
    """``settings`` whose server answers ``debug: true`` to the returned key: the configured debug or admin
    key, else a one-off key for this demo (debug answers need one; the demo shows the LLM's own order)."""
    for configured in (settings.serving.debug_api_key, settings.serving.admin_api_key):
        if configured is not None:
            return settings, configured.get_secret_value()
    key = secrets.token_urlsafe(24)
    serving = settings.serving.model_copy(update={"debug_api_key": SecretStr(key)})
    return settings.model_copy(update={"serving": serving}), key


def serve_and_ask(settings: Settings, artifact_dir: Path, known: str, other: str, gate: dict[str, Any]) -> None:
    settings, debug_key = with_debug_key(settings)
    with start_server_subprocess(settings, artifact_dir) as base_url:
        for user in (known, "a-user-nobody-has-seen"):
            resp = httpx.post(f"{base_url}/v1/recommend", json={"user_id": user, "k": 5}, timeout=30)
            resp.raise_for_status()
            show(f"POST /v1/recommend user_id={user!r}", resp.json())
        warm_up = httpx.post(f"{base_url}/v1/recommend", json={"user_id": other, "k": 5, "llm": True}, timeout=60)
        llm = next(s for s in warm_up.json()["stages"] if s["name"] == "llm")
        typer.echo(f"\n  warm-up: user_id={other!r} llm=true, the server's first forward pass (one-off allocations): "
                   f"llm {llm['status']} in {llm['ms']:.0f} ms")
        for n, label in enumerate(("first LLM request (cold prefix)", "same user again (warm prefix)")):
            before = llm_cache_counts(httpx.get(f"{base_url}/metrics", timeout=10).text)
            body = {"user_id": known, "k": 5, "llm": True, "debug": True, "context": {"demo_call": n}}
            resp = httpx.post(f"{base_url}/v1/recommend", json=body, headers={"X-API-Key": debug_key}, timeout=60)
            resp.raise_for_status()
            after = llm_cache_counts(httpx.get(f"{base_url}/metrics", timeout=10).text)
            answer = resp.json()
            show(f"POST /v1/recommend user_id={known!r} llm=true: {label}", answer)
            show_llm(answer, {k: after[k] - before[k] for k in after}, gate)


def show(title: str, body: dict[str, Any]) -> None:
    typer.secho(f"\n{title} -> {body['path']}", fg=typer.colors.GREEN)
    for item in body["items"]:
        extra = f"  [{'; '.join(item['disclaimers'])}]" if item.get("disclaimers") else ""
        typer.echo(f"  {item['rank']:>2}. {item['title']}  (score {item['score']:.3f}){extra}")
    stages = ", ".join(f"{s['name']}={s['status']}:{s['ms']:.1f}ms" for s in body["stages"])
    typer.echo(f"  cold_start={body['cold_start']} route={body.get('route')} stages: {stages}")
    typer.echo(f"  versions: {json.dumps(body['versions'])}")


def show_llm(answer: dict[str, Any], cache: dict[str, float], gate: dict[str, Any]) -> None:
    """The LLM stage's time, what the prefix cache held for it, and the order the fusion gate served."""
    llm = next(s for s in answer["stages"] if s["name"] == "llm")
    hits = cache["tier1_hits"] + cache["tier2_hits"]
    outcome = next((o for o in ("full", "partial", "miss") if cache[f"lookups_{o}"]), "none")
    typer.echo(f"  LLM stage: {llm['status']} in {llm['ms']:.1f} ms over {llm['n_in']} candidates; prefix cache: "
               f"{outcome} hit, {hits:.0f} of {cache['blocks_requested']:.0f} blocks cached (tier 1: "
               f"{cache['tier1_hits']:.0f}, tier 2: {cache['tier2_hits']:.0f}), {cache['stored']:.0f} computed")
    handoffs = {h["stage"]: h for h in answer["debug"]["handoffs"]}
    weights = {s: w for s, w in handoffs.get("fusion", {}).get("fusion_weights", {}).items() if w > 0}
    order = f"the {next(iter(weights))} order" if len(weights) == 1 else f"a mixture {weights}"
    typer.echo(f"  fusion gate: serves {order} ({gate['mixture_check'].get('kept', 'tuned weights')})")
    if llm["status"] == "ok":
        llm_top = [i["id"] for i in handoffs["llm"]["items"][:5]]
        typer.echo(f"  served top 5 {[i['id'] for i in answer['items']]}; the LLM's own top 5 {llm_top}")
