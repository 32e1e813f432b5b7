"""``recsys demo``: the whole system end to end on the embedded synthetic default.

Generates the synthetic catalog, trains recall, coarse ranker and fusion (reused on a second
run), starts the HTTP server on a free loopback port, sends one request for a known user and
one for an unknown user, prints the answers and stops the server.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

DEMO_RECALL_MAX_S = 90.0  # bound each two-tower fit so `make demo` stays within minutes on 2 cores


def run_demo(settings: Any, artifact_dir: Path, config: Path | None, users: int, items: int) -> None:
    import httpx

    from offline.jobs import prepare, train_stages
    from serving.bench import start_server_subprocess

    t0 = time.perf_counter()
    typer.secho(f"[1/3] preparing synthetic data in {artifact_dir}", bold=True)
    split = prepare(None, artifact_dir, n_users=users, n_items=items, seed=settings.seed)
    typer.echo(f"      {split.n_users} users, {split.n_items} items, {len(split.train)} training interactions")
    typer.secho("[2/3] training recall -> coarse ranker -> fusion (reused when present)", bold=True)
    recall = settings.recall.model_copy(update={"max_train_s": min(settings.recall.max_train_s, DEMO_RECALL_MAX_S)})
    report = train_stages(settings.model_copy(update={"recall": recall}), artifact_dir, split)
    for stage, rep in report.items():
        typer.echo(f"      {stage}: " + ("reused" if rep.get("reused") else f"{rep.get('seconds')} s"))
    typer.secho("[3/3] serving over HTTP and asking for recommendations", bold=True)
    known = str(split.vocab.user_ids[0])
    with start_server_subprocess(settings, artifact_dir) as base_url:
        for user in (known, "a-user-nobody-has-seen"):
            resp = httpx.post(f"{base_url}/v1/recommend", json={"user_id": user, "k": 5}, timeout=30)
            resp.raise_for_status()
            body = resp.json()
            typer.secho(f"\nPOST /v1/recommend user_id={user!r} -> {resp.status_code}", fg=typer.colors.GREEN)
            for item in body["items"]:
                extra = f"  [{'; '.join(item['disclaimers'])}]" if item.get("disclaimers") else ""
                typer.echo(f"  {item['rank']:>2}. {item['title']}  (score {item['score']:.3f}){extra}")
            stages = ", ".join(f"{s['name']}={s['status']}:{s['ms']:.1f}ms" for s in body["stages"])
            typer.echo(f"  cold_start={body['cold_start']} path={body['path']} stages: {stages}")
            typer.echo(f"  versions: {json.dumps(body['versions'])}")
    typer.secho(f"\ndemo finished in {time.perf_counter() - t0:.0f} s", bold=True)
