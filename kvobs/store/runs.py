"""A column of runs: each value repeated over its run, held as the values and the runs' lengths, not a value a row.

    kind = Runs(["stored", "removed"], [3, 1])   # stored, stored, stored, removed
    len(kind), kind.expanded()                   # 4, ["stored", "stored", "stored", "removed"]
    Runs.joined([kind, Runs([None], [2])])       # 6 rows, the NULLs a run of their own

The collector's KV-event rows share most of their columns within an event (its kind, tier, tokens, group, reason):
made as runs, a column costs a value an event instead of a list an event, and a columnar store takes it as it is
(ClickHouse's Arrow by index, a column of NULLs left out of the insert); a row store expands it once, in C."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat


class Runs:
    __slots__ = ("values", "lengths", "size")

    def __init__(self, values: list, lengths: list[int], size: int | None = None) -> None:
        """`size`: the lengths' sum, where the caller knows it (columns sharing their runs' lengths)."""
        if len(values) != len(lengths):
            raise ValueError(f"Runs: {len(values)} values for {len(lengths)} runs")
        self.values = values
        self.lengths = lengths
        self.size = sum(lengths) if size is None else size

    @classmethod
    def of(cls, value, n: int) -> Runs:
        """`n` rows of one value."""
        return cls([value], [n], n)

    def __len__(self) -> int:
        return self.size

    def expanded(self) -> list:
        """A value a row."""
        return list(chain.from_iterable(map(repeat, self.values, self.lengths)))

    def is_null(self) -> bool:
        """Whether every row is None (the count runs in C: a column of NULLs has a run an event)."""
        return self.values.count(None) == len(self.values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Runs) and self.expanded() == other.expanded()

    def __repr__(self) -> str:
        return f"Runs({self.values!r}, {self.lengths!r})"

    @staticmethod
    def joined(parts: Sequence[Runs], lengths: list[int] | None = None) -> Runs:
        """One column of the parts' rows, part after part; `lengths`: the joined runs' lengths, where the caller
        already joined them for another column with the same parts' runs (an event's columns share theirs)."""
        if lengths is None:
            lengths = list(chain.from_iterable(part.lengths for part in parts))
        values = list(chain.from_iterable(part.values for part in parts))
        return Runs(values, lengths, sum(part.size for part in parts))


def as_list(column: list | Runs) -> list:
    """A column as a value a row, whichever way it is held."""
    return column.expanded() if isinstance(column, Runs) else column


def is_null(column: list | Runs) -> bool:
    """Whether every row of a column is None, whichever way it is held (a list's count runs in C)."""
    if isinstance(column, Runs):
        return column.is_null()
    # (most columns hold a value at either end: no walk over the rows)
    return not column or (column[0] is None and column[-1] is None and column.count(None) == len(column))
