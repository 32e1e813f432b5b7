"""Structured JSON logs, one object per line, carrying the request id of the request being served.

``RequestContext`` (``serving.middleware``) puts each request's id in ``request_id_var``; the
``JsonFormatter`` adds it to every record logged while that request runs (including from the
threadpool: starlette copies context variables into the worker thread). ``log_config`` is
the ``logging.config.dictConfig`` dict ``serving.run`` hands to uvicorn, so uvicorn's own
loggers and ours share the format in every worker.

Deliberately left out: log shipping, sampling. Secrets are never logged (the admin key is a
``SecretStr`` and headers are not logged).
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from typing import Any

request_id_var: ContextVar[str] = ContextVar("request_id", default="")

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "request_id"?, ...extra, "exc"?}`` per record.

    >>> rec = logging.LogRecord("x", logging.INFO, "", 0, "hi %s", ("you",), None)
    >>> json.loads(JsonFormatter().format(rec))["msg"]
    'hi you'
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3) if record.created else round(time.time(), 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id_var.get()
        if rid:
            out["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in ("color_message",):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def log_config(level: str = "INFO") -> dict[str, Any]:
    """dictConfig for uvicorn's ``log_config``: every logger through one JSON handler on stderr."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "serving.logs.JsonFormatter"}},
        "handlers": {"default": handler},
        "root": {"handlers": ["default"], "level": level},
        "loggers": {
            "uvicorn": {"level": level},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"level": "WARNING"},  # RequestContext logs one richer line per request
        },
    }
