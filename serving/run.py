"""Process entry points: ``serve`` (uvicorn) and ``recommend_once`` (one in-process answer).

With ``workers > 1`` uvicorn needs an import string, not an app object: ``serve`` then
passes the settings (as JSON) and the artifact directory to the worker processes through
environment variables, and each worker builds its app with ``app_from_env``. The variable
names avoid the ``RECSYS_`` prefix on purpose: ``Settings`` reads every ``RECSYS_*``
variable as a configuration key and refuses unknown ones.

Deliberately left out: the command-line interface itself (``recsys.cli``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recsys.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

ENV_ARTIFACT_DIR = "SERVING_ARTIFACT_DIR"  # required by app_from_env
ENV_SETTINGS_JSON = "SERVING_SETTINGS_JSON"  # the full settings, as serve() resolved them
ENV_CONFIG_PATH = "SERVING_CONFIG"  # or a pipeline YAML (env RECSYS_* still applies on top)
APP_FACTORY = "serving.run:app_from_env"


def settings_from_env(environ: dict[str, str] | None = None) -> Settings:
    """Settings for a worker: ``SERVING_SETTINGS_JSON``, else ``SERVING_CONFIG``, else the default YAML."""
    env = os.environ if environ is None else environ
    if env.get(ENV_SETTINGS_JSON):
        import json

        return Settings.build(json.loads(env[ENV_SETTINGS_JSON]), source=f"${ENV_SETTINGS_JSON}")
    return Settings.from_yaml(env.get(ENV_CONFIG_PATH) or None)


def app_from_env() -> FastAPI:
    """uvicorn factory (``--factory serving.run:app_from_env``) for worker processes."""
    from serving.app import create_app

    artifact_dir = os.environ.get(ENV_ARTIFACT_DIR)
    if not artifact_dir:
        raise RuntimeError(f"{ENV_ARTIFACT_DIR} is not set: it names the per-dataset artifact directory to serve")
    return create_app(settings_from_env(), Path(artifact_dir))


def server_env(settings: Settings | Path | None, artifact_dir: Path) -> dict[str, str]:
    """The environment variables ``app_from_env`` reads, for ``settings`` (object, YAML path or default)."""
    env = {ENV_ARTIFACT_DIR: str(Path(artifact_dir).resolve())}
    if isinstance(settings, Settings):
        env[ENV_SETTINGS_JSON] = settings.model_dump_json()
    elif settings is not None:
        env[ENV_CONFIG_PATH] = str(Path(settings).resolve())
    return env


def serve(
    settings: Settings, artifact_dir: Path, host: str | None = None, port: int | None = None, workers: int | None = None
) -> None:
    """Run the HTTP server until interrupted; unset arguments come from ``settings.serving``."""
    import uvicorn

    host = host or settings.serving.host
    port = port or settings.serving.port
    workers = workers or settings.serving.workers
    if workers < 1:
        raise ValueError(f"serve: workers must be >= 1, got {workers}")
    if workers == 1:
        from serving.app import create_app

        uvicorn.run(create_app(settings, Path(artifact_dir)), host=host, port=port)
        return
    os.environ.update(server_env(settings, Path(artifact_dir)))
    uvicorn.run(APP_FACTORY, factory=True, host=host, port=port, workers=workers)


def recommend_once(
    settings: Settings,
    artifact_dir: Path,
    user_id: str,
    k: int | None = None,
    debug: bool = False,
    context: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Load everything, answer one request in-process: the same JSON as POST /v1/recommend.

    Raises ``ValueError`` naming the field for input the API would refuse with 422, and
    ``recsys.pipeline.PipelineError`` when a fail-closed stage fails (the API's 503).
    """
    from pydantic import ValidationError

    from serving.schemas import RecommendRequest, within_limits
    from serving.service import Recommender

    try:
        given = {"k": k} if k is not None else {}  # omitted k: the API default, capped by max_k
        body = RecommendRequest(user_id=user_id, context=context, debug=debug, **given)
    except ValidationError as exc:
        raise ValueError(f"invalid request: {exc}") from exc
    body = within_limits(body, settings)  # LimitError is a ValueError naming the field
    return Recommender.load(settings, Path(artifact_dir)).recommend(body)
