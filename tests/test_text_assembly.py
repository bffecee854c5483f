"""Stop sequences across token boundaries and UTF-8 characters split across tokens."""

from __future__ import annotations

from service.decode.text import Released, TextAssembler, earliest_stop


def feed(assembler: TextAssembler, pieces: list[bytes]) -> tuple[str, str | None]:
    text, stop = "", None
    for token_id, piece in enumerate(pieces):
        released = assembler.push(token_id, piece)
        text += released.text
        if released.stop_sequence is not None:
            return text, released.stop_sequence
    return text + assembler.flush().text, stop


def test_stop_sequence_split_across_tokens_is_not_emitted() -> None:
    text, stop = feed(TextAssembler(("END",)), [b"Hello E", b"N", b"D more"])
    assert (text, stop) == ("Hello ", "END")


def test_partial_stop_prefix_is_released_when_it_does_not_complete() -> None:
    text, stop = feed(TextAssembler(("END",)), [b"Hello E", b"N", b"o"])
    assert (text, stop) == ("Hello ENo", None)


def test_earliest_of_several_stops_wins() -> None:
    assert earliest_stop("hello world", ("world", "lo w")) == (3, "lo w")
    assert earliest_stop("hello", ("world",)) is None


def test_utf8_character_split_across_tokens_is_never_split_in_deltas() -> None:
    snowman = "☃".encode()  # three bytes
    assembler = TextAssembler()
    first = assembler.push(1, b"a" + snowman[:1])
    second = assembler.push(2, snowman[1:2])
    third = assembler.push(3, snowman[2:] + b"b")
    # Token 1's bytes end inside the snowman, so its "a" waits for the token
    # that completes the character: the ids of a delta spell exactly its text.
    assert [first.text, second.text, third.text] == ["", "", "a☃b"]
    assert [first.token_ids, second.token_ids, third.token_ids] == [(), (), (1, 2, 3)]


def test_invalid_utf8_is_replaced_at_the_end() -> None:
    assembler = TextAssembler()
    assert assembler.push(1, b"ok\xe2\x98") == Released("", ())
    assert assembler.flush() == Released("ok\ufffd", (1,))


def test_tokens_that_only_form_a_stop_sequence_are_dropped() -> None:
    assembler = TextAssembler(("###",))
    assert assembler.push(1, b"hi").token_ids == (1,)
    assert assembler.push(2, b"##").text == ""
    released = assembler.push(3, b"#")
    assert (released.text, released.token_ids, released.stop_sequence) == ("", (), "###")
