"""structlog lines on stderr (readable, or JSON for a log pipeline), with the client libraries'
stdlib logs folded in."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to sys.stderr as it is at each event, not as it was at set-up (tests swap it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass


def configure(level: str = "info", form: str = "json") -> None:
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    # Tracebacks without frame locals: locals can hold tokens and certificate paths. JSON gets
    # the traceback as a structure; the readable renderer wants it as text (it fails on a structure).
    render: list[structlog.types.Processor] = (
        [
            structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False)),
            structlog.processors.JSONRenderer(),
        ]
        if form == "json"
        else [structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)]
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
    )
    handler = _CurrentStderr()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The HTTP clients log request details at DEBUG; keep them at WARNING even then.
    for noisy in ("urllib3", "kubernetes.client.rest"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    logging.captureWarnings(True)
