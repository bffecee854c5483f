"""structlog set-up: JSON lines when not on a terminal, readable lines when on one."""

from __future__ import annotations

import logging
import sys
from typing import Protocol

import structlog


class LogSettings(Protocol):
    """The two settings every program here (server, picker, cluster) has."""

    @property
    def log_format(self) -> str: ...
    @property
    def log_level(self) -> str: ...


def configure_logging(settings: LogSettings) -> None:
    as_json = settings.log_format == "json" or (
        settings.log_format == "auto" and not sys.stderr.isatty()
    )
    configure(as_json=as_json, level=settings.log_level)


def configure(*, as_json: bool, level: str) -> None:
    """Log lines to stderr, as JSON or for a console, from `level` up."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # One write per line, newline included: print() writes the newline apart, and
        # when Python's streams are unbuffered (PYTHONUNBUFFERED, usual in containers)
        # that is two writes, so processes sharing one stderr (a cluster's replicas,
        # a server and its engines) interleave mid-line.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
