"""Settings precedence: flags over environment over the config file over defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.config import Settings, build_parser, load_settings
from service.front.overload import ConcurrencyGate
from tests.conftest import make_settings


def test_flags_override_environment_which_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "server.toml"
    config.write_text(
        'listen = "0.0.0.0:7000"\nthreads = 3\ncontext_size = 2048\n'
        '[models.mine]\npath = "/models/mine.gguf"\ncontext_size = 512\n'
    )
    monkeypatch.setenv("INFERENCE_THREADS", "5")
    monkeypatch.setenv("INFERENCE_CONTEXT_SIZE", "1024")
    settings = load_settings(["--config", str(config), "--context-size", "256"])
    assert settings.listen == "0.0.0.0:7000"  # file
    assert settings.threads == 5  # environment over file
    assert settings.context_size == 256  # flag over environment
    assert settings.models["mine"].context_size == 512
    assert settings.grace_period == 10.0  # default


def test_model_flag_is_repeatable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERENCE_CONFIG", raising=False)
    settings = load_settings(["--model", "a=/x/a.gguf", "--model", "b=/x/b.gguf"])
    assert {name: m.source for name, m in settings.models.items()} == {
        "a": "/x/a.gguf",
        "b": "/x/b.gguf",
    }


def test_the_step_size_is_chosen_by_the_backend_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("INFERENCE_CONFIG", raising=False)
    assert load_settings([]).batch_size is None
    assert load_settings(["--batch-size", "256"]).batch_size == 256
    monkeypatch.setenv("INFERENCE_BATCH_SIZE", "2048")
    assert load_settings([]).batch_size == 2048


@pytest.mark.parametrize(
    "argv",
    [
        ["--listen", "nope"],
        ["--threads", "0"],
        ["--batch-size", "0"],
        ["--model", "noequals"],
        # a misspelled flag, not an abbreviation of --max-waiting-sequences
        ["--max-waiting", "0"],
    ],
)
def test_bad_settings_stop_start_up_with_a_message(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        load_settings(argv)


def test_help_lists_every_setting_with_its_environment_variable() -> None:
    text = " ".join(build_parser().format_help().split())
    for flag, env in [
        ("--listen", "INFERENCE_LISTEN"),
        ("--config", "INFERENCE_CONFIG"),
        ("--model", "INFERENCE_MODELS"),
        ("--default-model", "INFERENCE_DEFAULT_MODEL"),
        ("--threads", "INFERENCE_THREADS"),
        ("--context-size", "INFERENCE_CONTEXT_SIZE"),
        ("--max-decode-seconds", "INFERENCE_MAX_DECODE_SECONDS"),
        ("--grace-period", "INFERENCE_GRACE_PERIOD"),
    ]:
        assert flag in text
        assert env in text


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (
            "models.yaml",
            "models:\n  big:\n    source: owner/repo:Q4_K_M\n    context_size: 8192\n"
            "  small:\n    path: small.gguf\n    threads: 1\n",
        ),
        (
            "models.toml",
            '[models.big]\nsource = "owner/repo:Q4_K_M"\ncontext_size = 8192\n'
            '[models.small]\npath = "small.gguf"\nthreads = 1\n',
        ),
    ],
)
def test_models_file_in_yaml_or_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str
) -> None:
    monkeypatch.delenv("INFERENCE_CONFIG", raising=False)
    models_file = tmp_path / name
    models_file.write_text(text)
    settings = load_settings(["--models-file", str(models_file), "--model", "small=elsewhere.gguf"])
    assert settings.models["big"].source == "owner/repo:Q4_K_M"
    assert settings.models["big"].context_size == 8192
    # A name given on the command line wins over the models file.
    assert settings.models["small"].source == "elsewhere.gguf"


def test_models_dir_env_is_path_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCE_MODELS_DIR", "/srv/a:/srv/b")
    assert [str(p) for p in load_settings([]).models_dir] == ["/srv/a", "/srv/b"]
    assert [str(p) for p in load_settings(["--models-dir", "/x"]).models_dir] == ["/x"]


def test_gpu_settings_default_to_device_zero_auto_flash_attention_and_no_gpu_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("INFERENCE_CONFIG", raising=False)
    settings = load_settings([])
    assert (settings.main_gpu, settings.flash_attention, settings.gpu_memory_budget) == (
        0,
        "auto",
        None,
    )
    monkeypatch.setenv("INFERENCE_FLASH_ATTENTION", "off")
    settings = load_settings(["--main-gpu", "1", "--gpu-memory-budget", "2GiB"])
    assert (settings.main_gpu, settings.flash_attention) == (1, "off")
    assert settings.gpu_memory_budget == 2 * 1024**3


@pytest.mark.parametrize("argv", [["--flash-attention", "yes"], ["--main-gpu", "-1"]])
def test_bad_gpu_settings_stop_start_up(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        load_settings(argv)


ROOT = Path(__file__).resolve().parent.parent


def _flags_in_settings_tables(markdown: Path) -> set[str]:
    """The flags named in the first column of a markdown file's settings tables."""
    return {
        flag
        for row in markdown.read_text().splitlines()
        if row.startswith("| `--")
        for flag in re.findall(r"`(--[a-z0-9-]+)", row.split("|")[1])
    }


def _setting_flags() -> set[str]:
    flags = {"--" + name.replace("_", "-") for name in Settings.model_fields}
    return (flags - {"--models"}) | {"--model"}  # the field behind the repeatable --model


def test_the_configuration_reference_lists_every_setting_and_no_other() -> None:
    """The reference a user reads stays in step with the settings: every setting has a
    row (by its flag) in docs/configuration.md's table, and every row is a setting."""
    listed = _flags_in_settings_tables(ROOT / "docs" / "configuration.md")
    assert sorted(_setting_flags() - listed) == []
    assert sorted(listed - _setting_flags()) == []


def test_the_readme_settings_table_names_only_real_settings() -> None:
    """The README's short table of the settings everyone touches names real flags."""
    listed = _flags_in_settings_tables(ROOT / "README.md")
    assert listed, "the README has no settings table"
    assert sorted(listed - _setting_flags()) == []


def test_model_work_slots_default_to_room_for_one_full_batch() -> None:
    """One model's share of the server-wide slots holds its whole batch by default:
    128 parallel sequences are not cut to 24 running streams by a fixed bound."""
    wide = make_settings(parallel_sequences=128)
    assert wide.max_concurrent == 256
    assert ConcurrencyGate(wide.max_concurrent, wide.max_queue).per_model_active >= 128
    assert make_settings().max_concurrent == 32  # 8 sequences: the floor
    assert make_settings(parallel_sequences=128, max_concurrent=10).max_concurrent == 10
