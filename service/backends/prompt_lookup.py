"""Prompt lookup: drafting a sequence's next tokens from its own history (issue 47).

An answer that quotes its input (a summary, a code edit, a RAG answer citing its
sources) repeats runs of tokens that are already in the sequence. When the last
few tokens occurred before, the tokens that followed them then are a good guess
for what follows now. The backend puts those guesses in the step beside the
sequence's real token, and keeps the ones the model agrees with (speculative
decoding without a second model).

The index is kept incrementally: every token appended registers the n-grams that
end just before it, so a draft costs a dictionary lookup per n-gram length, not
a scan of the history.

Each guess costs a row of the batch (on the CPU, about as much as another
stream's token), so a sequence whose guesses keep failing guesses less: a
guess the model rejects outright pauses drafting for a number of steps that
doubles with each such failure in a row (up to `LONGEST_PAUSE`), and the next
draft is as long as the last one held, plus one. A draft that holds entirely
restores the pause and grows the next one by two.
"""

from __future__ import annotations

from collections.abc import Iterable

# The longest n-gram tried first: a longer match is likelier to continue the same way.
LONGEST_MATCH = 3
# A single token recurs too often (punctuation, "the") for its follower to be a guess
# worth a row of the batch.
SHORTEST_MATCH = 2
# The most steps a sequence whose guesses fail goes without drafting.
LONGEST_PAUSE = 16


class PromptLookup:
    """One sequence's history and where each of its recent n-grams last occurred."""

    def __init__(self, history: Iterable[int] = ()) -> None:
        self._history: list[int] = []
        # n-gram -> the position of the token that followed its latest occurrence.
        self._followers: dict[tuple[int, ...], int] = {}
        self._length: int | None = None  # the next draft's most tokens; None: any
        self._paused = 0  # drafts still to skip
        self._pause = 1  # the next failure's pause
        self.extend(history)

    def __len__(self) -> int:
        return len(self._history)

    def extend(self, tokens: Iterable[int]) -> None:
        history, followers = self._history, self._followers
        for token in tokens:
            position = len(history)
            for n in range(SHORTEST_MATCH, LONGEST_MATCH + 1):
                if position >= n:
                    followers[tuple(history[position - n : position])] = position
            history.append(token)

    def draft(self, tokens: int) -> list[int]:
        """Up to `tokens` guesses for what follows the history; none without a match.

        The n-gram that ends the history is registered only once a token follows it,
        so a match is always an earlier occurrence."""
        history = self._history
        if self._paused:
            self._paused -= 1
            return []
        if self._length is not None:
            tokens = min(tokens, self._length)
        if tokens <= 0:
            return []
        for n in range(LONGEST_MATCH, SHORTEST_MATCH - 1, -1):
            if len(history) <= n:
                continue
            follower = self._followers.get(tuple(history[-n:]))
            if follower is not None:
                return history[follower : follower + tokens]
        return []

    def verified(self, drafted: int, held: int) -> None:
        """How the last draft fared: `held` of its `drafted` guesses were right."""
        if not drafted:
            return
        if held == 0:
            self._paused, self._pause = self._pause, min(self._pause * 2, LONGEST_PAUSE)
            self._length = 1
        elif held == drafted:
            self._pause, self._length = 1, held + 2
        else:
            self._pause, self._length = 1, held + 1
