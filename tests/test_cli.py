"""inference-client against a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from clients.cli import _print_stream, main
from inference.v1 import inference_pb2 as pb
from tests.certificates import make_pki
from tests.conftest import GEMMA, RunningServer, make_settings, serving


def test_generate_prints_text_then_a_summary(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--target", server.target, "generate", "--model", GEMMA, "--max-tokens", "6"]
    code = main([*argv, "--temperature", "0", "Q: What is the capital of France?\nA:"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "Paris" in out
    assert "finish: length" in err
    assert "6 completion tokens" in err


def test_generate_json_prints_one_event_per_line(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--target", server.target, "generate", "--json", "--temperature", "0"]
    code = main([*argv, "--max-tokens", "3", "Hello"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert "started" in lines[0]
    assert lines[0]["started"]["backend"] == "llama.cpp"
    assert all("delta" in line for line in lines[1:-1])
    assert lines[-1]["finished"]["usage"]["completionTokens"] == 3


def test_chat_flag_sends_messages(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--target", server.target, "generate", "--chat", "--json", "--temperature", "0"]
    code = main([*argv, "What is 2+2?"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert lines[-1]["finished"]["finishReason"] == "FINISH_REASON_END_OF_TURN"


def test_penalties_reach_the_sampler(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--target", server.target, "generate", "--model", GEMMA, "--temperature", "0"]
    prompt = "red, blue, red, blue, red, blue, red, blue,"
    texts = []
    # Positive penalties go through the batched sampler; negative ones, which raise
    # recent tokens, through llama.cpp's chain.
    for flags in ([], ["--frequency-penalty", "2"], ["--presence-penalty", "-2"]):
        assert main([*argv, "--max-tokens", "8", *flags, prompt]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0].count("red") > texts[1].count("red")
    assert texts[2] == texts[0]  # the pattern only grows likelier
    assert main([*argv, "--presence-penalty", "3", prompt]) == 2
    assert "presence_penalty must be in [-2, 2]" in capsys.readouterr().err


def test_errors_print_the_status_and_exit_nonzero(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--target", server.target, "generate", "--model", "nope", "hi"])
    assert code == 2
    assert "NOT_FOUND" in capsys.readouterr().err


def test_health_exits_zero_when_serving(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--target", server.target, "health"]) == 0
    assert capsys.readouterr().out.strip() == "SERVING"


def test_admit_prints_the_answer_and_exits_by_it(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--target", server.target, "admit", GEMMA]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["admitted"]
    assert answer["quantization"]["method"] == "Q4_K_M"
    assert main(["--target", server.target, "admit", "--image", GEMMA]) == 1
    assert "text model" in json.loads(capsys.readouterr().out)["reason"]


def test_tls_and_a_token_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = make_pki(tmp_path)
    settings = make_settings(tls_cert=pki.server.cert, tls_key=pki.server.key, auth_token="t0k")
    with serving(settings) as (running, _):
        base = ["--target", running.target, "--tls-ca", str(pki.ca.cert)]
        assert main([*base, "models"]) == 2  # no token
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        assert main([*base, "--token", "t0k", "--request-id", "cli-1", "models"]) == 0
        assert json.loads(capsys.readouterr().out)["defaultModel"]


def test_generate_with_a_grammar_and_logprobs(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--target", server.target, "generate", "--json", "--temperature", "0"]
    argv += ["--grammar", 'root ::= "yes" | "no"', "--top-logprobs", "2", "Answer:"]
    assert main(argv) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    deltas = [event["delta"] for event in events if "delta" in event]
    assert "".join(delta["text"] for delta in deltas) in ("yes", "no")
    assert all(len(entry["topLogprobs"]) == 2 for d in deltas for entry in d["logprobs"])


def test_an_unreadable_tls_file_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "ca.pem"
    code = main(["--tls-ca", str(missing), "--target", "127.0.0.1:1", "models"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"error: --tls-ca {missing}: No such file or directory\n"


class _Expired(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "Deadline Exceeded"


def _cut_short(texts: list[str]) -> Iterator[pb.GenerateResponse]:
    for text in texts:
        yield pb.GenerateResponse(delta=pb.TextDelta(text=text))
    raise _Expired()


@pytest.mark.parametrize("texts", [["Once", " upon"], ["a line\n"], []])
def test_an_error_after_some_text_is_printed_on_a_line_of_its_own(
    texts: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(grpc.RpcError):
        _print_stream(_cut_short(texts), as_json=False)
    out = capsys.readouterr().out
    assert out == "".join(texts) + ("\n" if texts and not texts[-1].endswith("\n") else "")
