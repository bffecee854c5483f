"""How `inference-cluster` reads its flags: what the replicas are told."""

from __future__ import annotations

import pytest

from service.cluster.launcher import DEFAULT_GRACE_PERIOD, parse_args


def _replicas_grace(server_args: list[str]) -> list[str]:
    at = [i for i, arg in enumerate(server_args) if arg.startswith("--grace-period")]
    return [
        server_args[i].partition("=")[2] if "=" in server_args[i] else server_args[i + 1]
        for i in at
    ]


def test_the_replicas_get_the_default_grace_period_when_none_is_given() -> None:
    args = parse_args(["--", "--threads", "1"])
    assert args.grace_period == DEFAULT_GRACE_PERIOD
    assert _replicas_grace(args.server_args) == [str(DEFAULT_GRACE_PERIOD)]


def test_a_grace_period_given_to_the_servers_is_theirs_and_the_launcher_s() -> None:
    """It used to be overridden by the launcher's default, appended after it."""
    for server_args in (["--grace-period", "60"], ["--grace-period=60"]):
        args = parse_args(["--", "--threads", "1", *server_args])
        assert args.grace_period == 60  # the launcher waits that long for them
        assert _replicas_grace(args.server_args) == ["60"]


def test_the_launcher_s_grace_period_goes_to_the_replicas() -> None:
    args = parse_args(["--grace-period", "30", "--", "--threads", "1"])
    assert args.grace_period == 30
    assert _replicas_grace(args.server_args) == ["30.0"]


def test_two_different_grace_periods_are_refused() -> None:
    with pytest.raises(SystemExit, match="give it once"):
        parse_args(["--grace-period", "30", "--", "--grace-period", "60"])
    assert parse_args(["--grace-period", "60", "--", "--grace-period", "60"]).grace_period == 60


def test_the_replicas_environment_sets_the_grace_period_when_no_flag_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It used to be overridden by the launcher's default flag."""
    monkeypatch.setenv("INFERENCE_GRACE_PERIOD", "45")
    args = parse_args(["--", "--threads", "1"])
    assert args.grace_period == 45  # the launcher waits that long for them
    assert _replicas_grace(args.server_args) == []  # they read the variable themselves
    flagged = parse_args(["--grace-period", "30", "--", "--threads", "1"])
    assert _replicas_grace(flagged.server_args) == ["30.0"]  # a flag still wins
    monkeypatch.setenv("INFERENCE_GRACE_PERIOD", "soon")
    with pytest.raises(SystemExit, match="INFERENCE_GRACE_PERIOD='soon'"):
        parse_args(["--", "--threads", "1"])
