"""The suite's tiers: a test's markers follow from what it uses (tests/tiers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from service.backends.llama_cpp import LlamaCppBackend
from tests import tiers
from tests.cluster_process import shared_cluster
from tests.conftest import make_settings, serving


def starts_a_server() -> None:
    with serving(make_settings()):
        pass


def loads_a_model_two_calls_down() -> None:
    def inner() -> object:
        return LlamaCppBackend

    _helper(inner)


def _helper(call: Any) -> None:
    call()


def builds_a_pipeline_imported_here() -> None:
    from tests.tiny_pipeline import build_tiny_sd_pipeline  # not imported before it runs

    assert callable(build_tiny_sd_pipeline)


def uses_a_helper_class() -> None:
    _Starter().start()


class _Starter:
    def start(self) -> None:
        starts_a_server()


def only_builds_settings() -> None:
    make_settings(threads=1)


def joins_the_shared_cluster() -> None:
    shared_cluster()


@pytest.mark.parametrize(
    ("function", "markers"),
    [
        (starts_a_server, {"server"}),
        (loads_a_model_two_calls_down, {"model"}),
        (builds_a_pipeline_imported_here, {"model"}),
        (uses_a_helper_class, {"server"}),
        (joins_the_shared_cluster, {"cluster"}),
        (only_builds_settings, set()),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_a_function_s_markers_follow_what_it_reaches(function: Any, markers: set[str]) -> None:
    assert tiers.markers_of(function) == markers


@dataclass
class Item:
    """What `tiers.mark` reads of a collected test, and the markers it adds."""

    function: Any
    fixtures: dict[str, Any] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)

    @property
    def fixturenames(self) -> list[str]:
        return list(self.fixtures)

    @property
    def _fixtureinfo(self) -> Any:
        definitions = {name: [SimpleNamespace(func=f)] for name, f in self.fixtures.items()}
        return SimpleNamespace(name2fixturedefs=definitions)

    def add_marker(self, name: str) -> None:
        self.added.append(name)


def a_server_fixture() -> Iterator[None]:
    with serving(make_settings()):
        yield


def a_test(running: None) -> None:
    pass


# Reached through a dict, so that the test below, which names them, stays a fast one.
EXAMPLES = {"test": a_test, "fixture": a_server_fixture, "plain": only_builds_settings}


def test_a_fixture_s_markers_are_its_tests_and_every_marked_test_is_slow() -> None:
    served = Item(EXAMPLES["test"], {"running": EXAMPLES["fixture"], "tmp_path": pytest.fixture})
    plain = Item(EXAMPLES["plain"])
    tiers.mark([served, plain])  # type: ignore[list-item]
    assert served.added == ["server", "slow"]
    assert plain.added == []


def test_every_marker_is_registered_and_every_seam_names_one() -> None:
    assert set(tiers.SEAMS.values()) <= set(tiers.TIERS) - {"slow"}
    assert "slow" in tiers.TIERS
