"""Which cached sequence a new request reuses, and what makes room: pure bookkeeping."""

from __future__ import annotations

from service.backends.llama_cpp.kv_slots import SlotTable


def started(table: SlotTable, prompt: list[int], max_tokens: int = 4) -> int:
    """Place and occupy; returns the sequence id used."""
    placement = table.place(prompt, max_tokens)
    assert placement is not None
    table.occupy(placement, len(prompt), max_tokens)
    return placement.slot.seq_id


def finish(table: SlotTable, seq_id: int, evaluated: list[int]) -> None:
    slot = table.slots[seq_id]
    slot.tokens = list(evaluated)
    table.release(slot)


def test_a_prompt_extending_a_finished_sequence_reuses_it_in_place() -> None:
    table = SlotTable(slots=4, capacity=100)
    first = started(table, [1, 2, 3])
    finish(table, first, [1, 2, 3, 7, 8])
    placement = table.place([1, 2, 3, 7, 8, 9, 10], max_tokens=4)
    assert placement is not None
    assert placement.slot.seq_id == first
    assert (placement.keep, placement.reuse, placement.copy_from) == (5, 5, None)


def test_the_last_prompt_token_is_always_evaluated_again() -> None:
    table = SlotTable(slots=2, capacity=100)
    finish(table, started(table, [1, 2, 3]), [1, 2, 3])
    placement = table.place([1, 2, 3], max_tokens=4)
    assert placement is not None
    assert placement.reuse == 2


def test_a_diverging_prompt_copies_the_shared_prefix_and_spares_the_conversation() -> None:
    table = SlotTable(slots=2, capacity=100)
    conversation = started(table, [1, 2, 3])
    finish(table, conversation, [1, 2, 3, 4, 5])
    placement = table.place([1, 2, 9, 9], max_tokens=4)
    assert placement is not None
    assert placement.slot.seq_id != conversation
    assert placement.copy_from is table.slots[conversation]
    assert placement.reuse == 2
    table.occupy(placement, 4, 4)
    assert table.slots[conversation].tokens == [1, 2, 3, 4, 5]


def test_without_a_free_slot_a_branch_trims_the_conversation_it_shares() -> None:
    table = SlotTable(slots=1, capacity=100)
    finish(table, started(table, [1, 2, 3]), [1, 2, 3, 4, 5])
    placement = table.place([1, 2, 9, 9], max_tokens=4)
    assert placement is not None
    assert (placement.keep, placement.reuse, placement.copy_from) == (2, 2, None)


def test_a_running_sequence_shares_its_prefix_by_copy() -> None:
    table = SlotTable(slots=3, capacity=100)
    running = started(table, [5, 6, 7, 8])
    table.slots[running].tokens = [5, 6, 7, 8]  # its prompt is evaluated
    placement = table.place([5, 6, 7, 1, 2], max_tokens=4)
    assert placement is not None
    assert placement.slot.seq_id != running
    assert placement.copy_from is table.slots[running]
    assert placement.reuse == 3


def test_several_conversations_stay_cached_side_by_side() -> None:
    table = SlotTable(slots=4, capacity=100)
    finish(table, started(table, [1, 1, 1]), [1, 1, 1, 2])
    finish(table, started(table, [3, 3, 3]), [3, 3, 3, 4])
    first_again = table.place([1, 1, 1, 2, 5], max_tokens=4)
    second_again = table.place([3, 3, 3, 4, 5], max_tokens=4)
    assert first_again is not None
    assert first_again.reuse == 4
    assert second_again is not None
    assert second_again.reuse == 4


def test_the_least_recently_used_idle_conversation_is_evicted_for_room() -> None:
    table = SlotTable(slots=4, capacity=30)
    old = started(table, [1] * 10)
    finish(table, old, [1] * 10)
    recent = started(table, [2] * 10)
    finish(table, recent, [2] * 10)
    placement = table.place([3] * 10, max_tokens=5)  # 15 more: only 10 are free
    assert placement is not None
    assert [slot.seq_id for slot in placement.evict] == [old]


def test_no_room_while_running_sequences_hold_the_cache() -> None:
    table = SlotTable(slots=4, capacity=30)
    started(table, [1] * 10, max_tokens=10)
    assert table.place([2] * 10, max_tokens=5) is None  # 20 reserved + 15 > 30
    assert table.place([2] * 5, max_tokens=5) is not None


def test_a_busy_slot_is_never_chosen_or_evicted() -> None:
    table = SlotTable(slots=2, capacity=100)
    busy = started(table, [1, 2, 3])
    other = started(table, [1, 2, 3])
    assert busy != other
    assert table.place([1, 2, 3], max_tokens=1) is None  # both slots run


def test_only_the_most_recent_finished_sequences_stay_cached() -> None:
    table = SlotTable(slots=4, capacity=100, keep_idle=2, keep_live=2)
    ids = [started(table, [n, n, n]) for n in (1, 2, 3)]
    for seq_id in ids:
        table.slots[seq_id].tokens = [seq_id] * 3
    assert table.release(table.slots[ids[0]]).drop == ()
    assert table.release(table.slots[ids[1]]).drop == ()
    retention = table.release(table.slots[ids[2]])
    assert [slot.seq_id for slot in retention.drop] == [ids[0]]
    assert retention.park == ()


def test_older_finished_sequences_are_parked_and_cost_no_cells() -> None:
    table = SlotTable(slots=4, capacity=30, keep_idle=3, keep_live=1)
    first = started(table, [1] * 10)
    table.slots[first].tokens = [1] * 12
    assert table.release(table.slots[first]).park == ()  # the most recent stays live
    second = started(table, [2] * 10)
    table.slots[second].tokens = [2] * 12
    retention = table.release(table.slots[second])
    assert [slot.seq_id for slot in retention.park] == [first]
    table.slots[first].parked = True  # as the backend does once it copied the cells out
    # 12 live cells + 18 new fit in 30 only because the parked 12 cost nothing.
    fits = table.place([3] * 10, max_tokens=8)
    assert fits is not None
    assert fits.evict == ()


def test_a_prompt_extending_a_parked_conversation_reuses_it() -> None:
    table = SlotTable(slots=3, capacity=100, keep_idle=2, keep_live=0)
    conversation = started(table, [1, 2, 3])
    table.slots[conversation].tokens = [1, 2, 3, 4]
    assert [s.seq_id for s in table.release(table.slots[conversation]).park] == [conversation]
    table.slots[conversation].parked = True
    placement = table.place([1, 2, 3, 4, 5, 6], max_tokens=4)
    assert placement is not None
    assert placement.slot.seq_id == conversation
    assert placement.reuse == 4


def test_parked_conversations_hold_no_more_tokens_than_the_cache() -> None:
    table = SlotTable(slots=5, capacity=30, keep_idle=4, keep_live=1)
    ids = []
    for n in (1, 2, 3):
        seq_id = started(table, [n] * 5)
        table.slots[seq_id].tokens = [n] * 16
        retention = table.release(table.slots[seq_id])
        for slot in retention.park:  # as the backend does
            slot.parked = True
        for slot in retention.drop:
            slot.tokens.clear()
            slot.parked = False
        ids.append(seq_id)
    oldest, middle, newest = (table.slots[i] for i in ids)
    # The newest stays live and the next parks (16 tokens); the oldest would make 32 > 30.
    assert (newest.parked, middle.parked) == (False, True)
    assert oldest.tokens == []


def parked_conversation(table: SlotTable, tokens: list[int]) -> int:
    seq_id = started(table, tokens[:2])
    table.slots[seq_id].tokens = list(tokens)
    table.release(table.slots[seq_id])
    table.slots[seq_id].parked = True  # as the backend does once it copied the cells out
    return seq_id


def test_a_few_shared_tokens_are_not_worth_restoring_a_parked_conversation() -> None:
    table = SlotTable(slots=3, capacity=100, keep_idle=2, keep_live=0)
    parked_conversation(table, [1, 2, *range(100, 130)])  # 32 tokens
    placement = table.place([1, 2, 9, 9], max_tokens=4)
    assert placement is not None
    assert (placement.copy_from, placement.reuse) == (None, 0)


def test_a_large_share_of_a_parked_conversation_is_copied() -> None:
    table = SlotTable(slots=3, capacity=100, keep_idle=2, keep_live=0)
    conversation = parked_conversation(table, list(range(1, 33)))
    placement = table.place([*range(1, 17), 99, 99], max_tokens=4)
    assert placement is not None
    assert placement.copy_from is table.slots[conversation]
    assert placement.reuse == 16


def test_on_a_tie_a_live_conversation_is_the_donor_rather_than_a_parked_one() -> None:
    table = SlotTable(slots=4, capacity=100, keep_idle=2, keep_live=0)
    parked_conversation(table, [1, 2, 3, 4])
    live = started(table, [1, 2])
    table.slots[live].tokens = [1, 2, 3, 5]
    table.slots[live].reserved = None  # finished, still in the cache
    placement = table.place([1, 2, 3, 9, 9], max_tokens=4)
    assert placement is not None
    assert placement.copy_from is table.slots[live]
    assert placement.reuse == 3


def test_per_sequence_caches_count_room_per_slot() -> None:
    table = SlotTable(slots=3, capacity=10, shared=False)
    started(table, [1] * 6, max_tokens=4)
    started(table, [2] * 6, max_tokens=4)  # 20 tokens in all, 10 per slot
    assert table.place([3] * 6, max_tokens=5) is None  # 11 > 10 for any one slot


def test_per_sequence_running_sequences_take_the_lowest_free_ids() -> None:
    table = SlotTable(slots=4, capacity=100, shared=False)
    assert [started(table, [n, n]) for n in (1, 2, 3)] == [0, 1, 2]


def test_per_sequence_a_finished_conversation_moves_to_the_highest_empty_slot() -> None:
    table = SlotTable(slots=4, capacity=100, keep_idle=2, shared=False)
    first = started(table, [1, 2])
    table.slots[first].tokens = [1, 2, 3]
    retention = table.release(table.slots[first])
    assert retention.park == ()
    assert [(a.seq_id, b.seq_id) for a, b in retention.move] == [(0, 3)]
    table.moved(*retention.move[0])
    assert (table.slots[0].tokens, table.slots[3].tokens) == ([], [1, 2, 3])
    assert started(table, [9, 9]) == 0  # the low ids stay for running sequences


def test_per_sequence_a_continued_conversation_moves_down_to_the_running_ones() -> None:
    table = SlotTable(slots=4, capacity=100, keep_idle=2, shared=False)
    table.slots[3].tokens = [1, 2, 3]  # a cached conversation, moved up when it finished
    placement = table.place([1, 2, 3, 4, 5], max_tokens=4)
    assert placement is not None
    assert (placement.slot.seq_id, placement.copy_from, placement.moves) == (
        0,
        table.slots[3],
        True,
    )
    assert placement.reuse == 3


def test_a_repeated_prompt_branches_inside_its_long_answer_when_a_copy_finds_no_room() -> None:
    # Issue 46: after a long answer, the same prompt was refused room, because the
    # conversation it would copy its prefix from was spared from eviction.
    table = SlotTable(slots=4, capacity=100)
    prompt = list(range(1, 31))
    conversation = started(table, prompt, max_tokens=60)
    finish(table, conversation, prompt + [7] * 60)
    placement = table.place(prompt, max_tokens=60)
    assert placement is not None
    assert placement.slot.seq_id == conversation
    assert (placement.keep, placement.reuse, placement.copy_from) == (29, 29, None)


def test_a_repeated_prompt_still_copies_when_the_conversation_and_it_both_fit() -> None:
    table = SlotTable(slots=4, capacity=200)
    prompt = list(range(1, 31))
    conversation = started(table, prompt, max_tokens=60)
    finish(table, conversation, prompt + [7] * 60)
    placement = table.place(prompt, max_tokens=60)
    assert placement is not None
    assert placement.slot.seq_id != conversation
    assert placement.copy_from is table.slots[conversation]


def test_any_request_that_fits_the_cache_is_placed_once_nothing_runs() -> None:
    # Whatever idle conversations hold, an empty batch never answers "no room".
    table = SlotTable(slots=3, capacity=64)
    histories = [[1, 2, 3] + [4] * 40, [1, 2, 9] + [5] * 50, [8] * 30]
    for history in histories:
        finish(table, started(table, history[:3], max_tokens=1), history)
    for prompt in ([1, 2, 3, 4], [1, 2, 9], [8] * 20, [1] + [6] * 40, [1, 2, 3] + [4] * 40):
        placement = table.place(prompt, max_tokens=64 - len(prompt))
        assert placement is not None, prompt
