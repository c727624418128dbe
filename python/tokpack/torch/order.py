"""The epoch order and rank split of the streaming readers (torch-free: see ``tokpack._order``)."""

from .._order import TAILS, EpochOrder, RankSplit

__all__ = ["EpochOrder", "RankSplit", "TAILS"]
