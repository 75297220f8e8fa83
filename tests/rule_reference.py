"""The reference the rule checks are tested against: rules dropped one contradiction at a time,
every search started over after a drop between origins (the plain, quadratic way)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from opendrs.engine.constraints import RuleProblem
from opendrs.model.rules import ORIGINS, GuestAffinity, NodeAffinity, precedence

WORDS = {"platform": "platform", "config": "configured", "pool": "pool", "tag": "tag"}
AnyRule = NodeAffinity | GuestAffinity
#: A contradiction: the rules involved, those that go, the problem, what it is.
Found = tuple[list[AnyRule], list[AnyRule], RuleProblem, str]


class StartingOver:
    """The rules dropped so far (node and guest rules apart) and a problem per drop."""

    def __init__(self) -> None:
        self.dropped: set[tuple[bool, str]] = set()
        self.problems: list[RuleProblem] = []

    def kept(self, rule: AnyRule) -> bool:
        return (isinstance(rule, NodeAffinity), rule.name) not in self.dropped

    def drop(self, going: Sequence[AnyRule], problem: RuleProblem | None) -> None:
        self.dropped.update((isinstance(r, NodeAffinity), r.name) for r in going)
        if problem is not None:
            self.problems.append(problem)

    def by_origin(self, involved: Sequence[AnyRule], what: str) -> bool:
        """Rules of several origins: the latest origin's go (ignored), True; else False."""
        ranks = {precedence(r.origin) for r in involved}
        if len(ranks) < 2:
            return False
        holding = tuple(
            dict.fromkeys(r.name for r in involved if precedence(r.origin) == min(ranks))
        )
        going = [r for r in involved if precedence(r.origin) == max(ranks)]
        noun, verb = ("rule", "holds") if len(holding) == 1 else ("rules", "hold")
        names = ", ".join(f"'{n}'" for n in holding)
        reason = f"{what}, and {WORDS[ORIGINS[min(ranks)]]} {noun} {names} {verb}"
        going_names = tuple(dict.fromkeys(r.name for r in going))
        self.drop(going, RuleProblem(going_names, reason, holding, going[0].origin))
        return True

    def settle(self, find: Callable[[], Iterator[Found]]) -> None:
        """Between origins, each contradiction ``find`` yields, starting over after each drop;
        then the rest, each dropped (without a problem when none of its rules is left)."""
        while any(self.by_origin(involved, what) for involved, _, _, what in find()):
            pass
        for _, going, problem, _ in find():
            self.drop(going, problem if problem.rules else None)
