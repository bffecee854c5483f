"""Prompt lookup drafts (service.backends.prompt_lookup), without a model."""

from __future__ import annotations

from service.backends.prompt_lookup import PromptLookup


def test_the_tokens_that_followed_the_last_match_are_the_draft() -> None:
    lookup = PromptLookup([10, 11, 12, 13, 14, 15, 99, 11, 12])
    assert lookup.draft(3) == [13, 14, 15]
    assert lookup.draft(1) == [13]


def test_the_longest_match_wins_over_a_more_recent_shorter_one() -> None:
    # "2 3" is followed by 7 most recently, but "1 2 3" matches only the first run.
    lookup = PromptLookup([1, 2, 3, 4, 5, 0, 2, 3, 7, 8, 1, 2, 3])
    assert lookup.draft(2) == [4, 5]


def test_the_most_recent_occurrence_of_a_match_is_used() -> None:
    lookup = PromptLookup([5, 6, 1, 0, 5, 6, 2, 0, 5, 6])
    assert lookup.draft(2) == [2, 0]


def test_no_match_no_draft_and_a_single_token_is_not_a_match() -> None:
    assert PromptLookup([1, 2, 3, 4]).draft(4) == []
    assert PromptLookup([7, 1, 8, 1]).draft(2) == []  # only the 1-gram "1" recurs
    assert PromptLookup([1, 2, 3, 1, 2]).draft(0) == []


def test_tokens_appended_later_are_matched_and_the_draft_stops_at_the_history_s_end() -> None:
    lookup = PromptLookup([4, 5, 6])
    assert lookup.draft(3) == []
    lookup.extend([4, 5])
    assert lookup.draft(5) == [6, 4, 5]  # the follower run reaches the present
    assert len(lookup) == 5


def test_failing_guesses_pause_drafting_for_longer_each_time_and_a_hit_resets_it() -> None:
    lookup = PromptLookup([1, 2, 3, 9, 1, 2, 3])
    assert lookup.draft(4) == [9, 1, 2, 3]
    lookup.verified(4, 0)  # all wrong: one step without a draft, then one guess
    assert lookup.draft(4) == []
    assert lookup.draft(4) == [9]
    lookup.verified(1, 0)  # wrong again: two steps without
    assert [lookup.draft(4) for _ in range(3)] == [[], [], [9]]
    lookup.verified(1, 1)  # right: the pause resets, the next draft may be 3 long
    assert lookup.draft(4) == [9, 1, 2]
    lookup.verified(3, 2)  # partly right: as long as what held, plus one
    assert lookup.draft(4) == [9, 1, 2]
    lookup.verified(3, 0)
    assert lookup.draft(4) == []  # the pause restarted at one step
    assert lookup.draft(4) == [9]
