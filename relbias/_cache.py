"""The one kind of memo the core keeps: a bounded cache (the latest entries, the oldest dropped).

Every cache of the core is one of these, with its bound next to it (the compile accounting,
FlexAttention's block masks, the table path's workspace, a prepared bias's pieces), so that
no cache grows with the number of shapes a long-running process meets.
"""

from __future__ import annotations

from collections import OrderedDict


class LRUCache(OrderedDict):
    """A dict that keeps its ``maxsize`` most recently used entries.

    Reading an entry (``cache[key]``, :meth:`memo`) or writing one makes it the most
    recent; a write beyond ``maxsize`` entries drops the least recently used.
    """

    def __init__(self, maxsize: int):
        super().__init__()
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"maxsize must be an integer >= 1, got {maxsize!r}")
        self.maxsize = maxsize

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)

    def __reduce__(self):  # copy and pickle with the bound (OrderedDict's calls cls())
        return type(self), (self.maxsize,), None, None, iter(self.items())

    def memo(self, key, make):
        """The entry of ``key``, made by ``make()`` (and kept) when there is none."""
        if key in self:
            return self[key]
        value = make()
        self[key] = value
        return value
