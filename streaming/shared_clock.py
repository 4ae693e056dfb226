"""Each view's clock, shared by the window writer processes.

A view's clock is the greatest on-time event time of its source, but each writer sees only the tiles of the
entities in its own partitions. Every writer publishes the greatest event time it has seen per view in a shared
array (one slot per writer and view) and follows the greatest of them, so the windows of all entities slide
together, as with one writer. Only the publishing writer writes its slots; the others read them.
"""

from __future__ import annotations

from typing import Optional

NONE = -(2 ** 63)  # no event seen yet


class SharedClock:
    """`heads`: an int64 array of `writers * views` slots, shared between processes (`multiprocessing.Array`)."""

    def __init__(self, heads, views: int, writer: int):
        self.heads = heads
        self.views = views
        self.writer = writer
        self.writers = len(heads) // views

    @staticmethod
    def slots(views: int, writers: int) -> int:
        return views * writers

    def publish(self, view: int, head_ms: Optional[int]) -> None:
        if head_ms is not None:
            self.heads[self.writer * self.views + view] = head_ms

    def head(self, view: int) -> Optional[int]:
        """The view's clock over every writer: the greatest event time any of them has seen."""
        found = max(self.heads[w * self.views + view] for w in range(self.writers))
        return None if found == NONE else found
