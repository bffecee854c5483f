"""Which rules each rule can start with, and what llama.cpp will do with that.

Once llama.cpp has parsed a grammar it checks it for left recursion with a
recursive walk along the rules each rule can start with, revisiting shared
rules on every path (exponential time for rules that each start with two
references to the next); then it builds parser stacks by going down those same
rules, where a rule that can start with itself after rules matching empty text
(a cycle the left-recursion check misses) makes it loop until memory runs out.

A rule can start with the rules referenced at the head of its alternatives,
and past each one that can match empty text, with the next. llama.cpp's check
looks past a rule only if it has a literally empty alternative; this graph
looks past every rule that can match empty text, so it holds all of
llama.cpp's edges and the cycles its check misses. Everything here is
iterative and linear in the grammar's size.
"""

from __future__ import annotations

from collections import deque
from typing import NoReturn

from service.errors import InvalidRequest, excerpt
from service.grammar.gbnf_scan import ParsedGrammar
from service.grammar.grammar_limits import GrammarLimits, limit_exceeded

Alternative = list[int]


def check_rule_graph(parsed: ParsedGrammar, what: str, limits: GrammarLimits) -> int:
    """Refuse left recursion, long chains, exponential checks and wide fan-outs.

    Returns the widest fan-out: the most parser stacks one position can lead to,
    each of which llama.cpp checks against every token of the vocabulary.
    """
    return _RuleGraph(parsed, what, limits).check()


class _RuleGraph:
    def __init__(self, parsed: ParsedGrammar, what: str, limits: GrammarLimits) -> None:
        self.parsed = parsed
        self.rules = [alts or [] for alts in parsed.rules]
        self.what = what
        self.limits = limits
        self.nullable = _nullable_rules(self.rules)
        self.edges = [self._starts(alts) for alts in self.rules]

    def check(self) -> int:
        order = self._children_first()
        self._check_chains(order)
        self._check_left_work(order)
        return self._check_branches(order)

    def _starts(self, alts: list[Alternative]) -> list[int]:
        """The rules the alternatives can start with, once per reference as llama.cpp walks them."""
        starts = []
        for alt in alts:
            for item in alt:
                if item < 0:
                    break
                starts.append(item)
                if item not in self.nullable:
                    break
        return starts

    def _children_first(self) -> list[int]:
        """Rules ordered so that each comes after those it can start with; refuse a cycle."""
        waiting = [len(set(children)) for children in self.edges]
        parents: list[list[int]] = [[] for _ in self.edges]
        for rule, children in enumerate(self.edges):
            for child in set(children):
                parents[child].append(rule)
        ready = deque(rule for rule, count in enumerate(waiting) if count == 0)
        order = []
        while ready:
            rule = ready.popleft()
            order.append(rule)
            for parent in parents[rule]:
                waiting[parent] -= 1
                if waiting[parent] == 0:
                    ready.append(parent)
        if len(order) < len(self.edges):
            self._refuse_cycle({rule for rule, count in enumerate(waiting) if count > 0})
        return order

    def _refuse_cycle(self, stuck: set[int]) -> NoReturn:
        rule = min(stuck)
        seen: set[int] = set()
        while rule not in seen:  # each stuck rule starts with another stuck rule
            seen.add(rule)
            rule = next(child for child in self.edges[rule] if child in stuck)
        raise InvalidRequest(
            f"{self.what}: rule {self._name(rule)} is left-recursive: it can start with "
            "itself before matching any text, which llama.cpp cannot sample from"
        )

    def _check_chains(self, order: list[int]) -> None:
        depth = [0] * len(self.rules)
        for rule in order:
            depth[rule] = 1 + max((depth[child] for child in self.edges[rule]), default=0)
            if depth[rule] > self.limits.left_chain:
                subject = f"the chain of rules starting one another from rule {self._name(rule)}"
                self._refuse(subject, self.limits.left_chain, "rules")

    def _check_left_work(self, order: list[int]) -> None:
        """Replay llama.cpp's left-recursion check: a full walk from each rule not yet visited."""
        cap = self.limits.left_work + 1
        work = [0] * len(self.rules)  # rule visits (weighted by size) of a walk from each rule
        for rule in order:
            own = self.parsed.size(rule)
            for child in self.edges[rule]:
                own += work[child]
            work[rule] = min(cap, own)
        visited = [False] * len(self.rules)
        total = 0
        for rule in range(len(self.rules)):
            if visited[rule]:
                continue
            total += work[rule]
            if total > self.limits.left_work:
                subject = "the work of llama.cpp's left-recursion check on its rules"
                self._refuse(subject, self.limits.left_work, "steps")
            todo = [rule]
            while todo:
                current = todo.pop()
                if not visited[current]:
                    visited[current] = True
                    todo.extend(self.edges[current])

    def _check_branches(self, order: list[int]) -> int:
        """Refuse when one position can fan out to too many parser stacks; else the
        most it can.

        From a position in an alternative, llama.cpp's stack advance goes down
        into the rule referenced there (one stack per way that rule can start),
        and on to the next item while what it passed can match empty text.
        """
        cap = self.limits.branches + 1
        ways = [0] * len(self.rules)  # stacks a reference to each rule fans out to
        for rule in order:
            ways[rule] = min(cap, sum(self._fan_out(alt, ways, cap) for alt in self.rules[rule]))
            if ways[rule] == cap:
                self._refuse_branches(rule, "start")
        widest = max(ways, default=1)
        for rule, alts in enumerate(self.rules):
            for alt in alts:
                width = self._widest(alt, ways, cap)
                if width == cap:
                    self._refuse_branches(rule, "go on at one point")
                widest = max(widest, width)
        return widest

    def _refuse_branches(self, rule: int, how: str) -> NoReturn:
        subject = f"the number of ways rule {self._name(rule)} can {how}"
        self._refuse(subject, self.limits.branches, "alternatives")

    def _fan_out(self, alt: Alternative, ways: list[int], cap: int) -> int:
        """The stacks an advance into `alt` from its start produces."""
        total = 0
        for item in alt:
            if item < 0:
                return min(cap, total + 1)
            total += ways[item]
            if item not in self.nullable or total >= cap:
                return min(cap, total)
        return min(cap, total + 1)  # the alternative can end here: one more stack

    def _widest(self, alt: Alternative, ways: list[int], cap: int) -> int:
        """The most stacks an advance from any position of `alt` produces, in one pass."""
        after, widest = 1, 1
        for item in reversed(alt):
            if item < 0:
                after = 1
            elif item in self.nullable:
                after = min(cap, ways[item] + after)
            else:
                after = ways[item]
            if after > widest:
                widest = after
        return widest

    def _name(self, rule: int) -> str:
        return excerpt(self.parsed.name(rule))

    def _refuse(self, subject: str, limit: int, unit: str) -> NoReturn:
        raise limit_exceeded(self.what, subject, limit, unit)


def _nullable_rules(rules: list[list[Alternative]]) -> set[int]:
    """Rules that can match empty text, in time linear in the grammar's size."""
    pending: list[int] = []  # per alternative: references not yet known to match empty text
    owner: list[int] = []
    uses: dict[int, list[int]] = {}
    ready: list[int] = []
    for rule, alts in enumerate(rules):
        for alt in alts:
            if any(item < 0 for item in alt):
                continue  # a terminal never matches empty text
            pending.append(len(alt))
            owner.append(rule)
            for item in alt:
                uses.setdefault(item, []).append(len(pending) - 1)
            if not alt:
                ready.append(rule)
    nullable: set[int] = set()
    while ready:
        rule = ready.pop()
        if rule in nullable:
            continue
        nullable.add(rule)
        for index in uses.get(rule, ()):
            pending[index] -= 1
            if pending[index] == 0:
                ready.append(owner[index])
    return nullable
