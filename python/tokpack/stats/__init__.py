"""``tokpack.packing_stats`` (``estimate``): what packing a corpus would cost at several
``max_len`` candidates, with advice; and its figure (``plot``, ``tokpack stats --plot``)."""

from .estimate import PackingStats, packing_stats

__all__ = ["PackingStats", "packing_stats"]
