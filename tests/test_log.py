"""Log lines reach stderr whole, so processes sharing it never split each other's."""

from __future__ import annotations

import sys

import pytest
import structlog

from service.log import configure, configure_logging
from tests.conftest import make_settings


class RecordedStream:
    """A stream that keeps each write apart, as an unbuffered pipe would pass them on."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize("as_json", [True, False])
def test_each_log_line_is_one_write_with_its_newline(
    monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    stream = RecordedStream()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        configure(as_json=as_json, level="info")
        log = structlog.get_logger("test")
        log.info("replica up", models=["a", "b"])
        log.warning("replica down", address="127.0.0.1:1")
    finally:
        monkeypatch.undo()
        configure_logging(make_settings())
    assert len(stream.writes) == 2, stream.writes
    assert all(write.endswith("\n") and write.count("\n") == 1 for write in stream.writes)
    assert "replica up" in stream.writes[0]
    assert "replica down" in stream.writes[1]
