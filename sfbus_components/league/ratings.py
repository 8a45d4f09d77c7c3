"""A league's payoff table and Elo ratings, free of processes and messages.

Players are named ``policy:<id>`` (a policy as it trains now) and ``snapshot:<id>`` (a frozen
snapshot of the store). Each match between two players is recorded once with the first
player's score: 1 a win, 0.5 a draw, 0 a loss. The table keeps wins, draws and losses per
ordered pair (both orders, so either side reads its own row), and both players' Elo ratings move
by ``k * (score - expected)``, ``expected = 1 / (1 + 10 ** ((other - own) / 400))``.
"""

from __future__ import annotations

from typing import Any

INITIAL_RATING = 1000.0
"""A new player's rating (a snapshot starts from its policy's rating instead)."""


def policy_player(policy: int) -> str:
    """The player name of a live policy."""
    return f"policy:{policy}"


def snapshot_player(snapshot: int) -> str:
    """The player name of a snapshot of the store."""
    return f"snapshot:{snapshot}"


def elo_expected(rating: float, other: float) -> float:
    """The score Elo expects of a player rated ``rating`` against one rated ``other``."""
    return 1.0 / (1.0 + 10.0 ** ((other - rating) / 400.0))


def elo_update(rating: float, other: float, score: float, k: float) -> tuple[float, float]:
    """Both ratings after a match in which the first player scored ``score``."""
    delta = k * (score - elo_expected(rating, other))
    return rating + delta, other - delta


class Payoff:
    """Results per ordered pair of players ``[wins, draws, losses]`` and a rating per player."""

    def __init__(self, k: float = 16.0) -> None:
        self.k = k
        self.ratings: dict[str, float] = {}
        self.table: dict[tuple[str, str], list[int]] = {}
        self.matches = 0

    def add_player(self, name: str, rating: float = INITIAL_RATING) -> None:
        """Enter ``name`` with ``rating`` unless it plays already."""
        self.ratings.setdefault(name, rating)

    def record(self, player: str, opponent: str, score: float) -> None:
        """One match: ``player`` scored ``score`` (1, 0.5 or 0) against ``opponent``."""
        if score not in (0.0, 0.5, 1.0):
            raise ValueError(f"a match's score is 1, 0.5 or 0, not {score}")
        for name in (player, opponent):
            self.add_player(name)
        column = {1.0: 0, 0.5: 1, 0.0: 2}[score]
        self.table.setdefault((player, opponent), [0, 0, 0])[column] += 1
        self.table.setdefault((opponent, player), [0, 0, 0])[2 - column] += 1
        self.ratings[player], self.ratings[opponent] = elo_update(
            self.ratings[player], self.ratings[opponent], score, self.k)
        self.matches += 1

    def take_rating(self, player: str, source: str) -> None:
        """``player`` is now a copy of ``source`` (a PBT exchange): it takes ``source``'s rating;
        its results so far stay in the table, as the matches they were."""
        self.add_player(source)
        self.ratings[player] = self.ratings[source]

    def games(self, player: str, opponent: str) -> int:
        """Matches ``player`` played against ``opponent``."""
        return sum(self.table.get((player, opponent), (0, 0, 0)))

    def win_rate(self, player: str, opponent: str) -> float | None:
        """``player``'s mean score against ``opponent`` (a draw counts half); None unplayed."""
        wins, draws, losses = self.table.get((player, opponent), (0, 0, 0))
        games = wins + draws + losses
        return None if games == 0 else (wins + 0.5 * draws) / games

    def pooled_win_rate(self, players: list[str], opponent: str) -> float | None:
        """The mean score of all of ``players`` together against ``opponent``; None unplayed."""
        rows = [self.table.get((p, opponent), (0, 0, 0)) for p in players]
        games = sum(sum(row) for row in rows)
        return None if games == 0 else sum(w + 0.5 * d for w, d, _ in rows) / games

    def state(self) -> dict[str, Any]:
        """The table and ratings as JSON values."""
        return {"matches": self.matches, "ratings": dict(self.ratings),
                "table": [[a, b, *row] for (a, b), row in sorted(self.table.items())]}

    @classmethod
    def from_state(cls, state: dict[str, Any], k: float) -> Payoff:
        """The payoff that :meth:`state` saved, rated on with ``k``."""
        payoff = cls(k)
        payoff.matches = int(state["matches"])
        payoff.ratings = {name: float(r) for name, r in state["ratings"].items()}
        payoff.table = {(a, b): [int(w), int(d), int(lo)] for a, b, w, d, lo in state["table"]}
        return payoff
