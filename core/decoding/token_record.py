"""The per-token record of a decoding run: every metric of every row, written by position.

Arrays are allocated once per doubling (never per step) and cut per row at the end, so the record of a
T-token response costs O(T) time and (bytes per token) x T memory.
"""

from __future__ import annotations

import numpy as np


class TokenRecord:
    """name -> (B, capacity, ...) arrays; position p of the response is column p - start."""

    def __init__(self, n_rows: int, start: int = 0) -> None:
        self.n_rows, self.start = n_rows, start
        self.arrays: dict[str, np.ndarray] = {}
        self.capacity = 0

    def _fit(self, stop: int, like: dict[str, np.ndarray]) -> None:
        """Make room for columns < stop, allocating arrays shaped and typed like `like` (name -> (B, ...))."""
        if not self.arrays:
            self.capacity = max(64, stop)
            self.arrays = {name: np.zeros((self.n_rows, self.capacity) + v.shape[1:], dtype=v.dtype)
                           for name, v in like.items()}
        elif stop > self.capacity:
            self.capacity = max(stop, 2 * self.capacity)
            for name, old in self.arrays.items():
                new = np.zeros((self.n_rows, self.capacity) + old.shape[2:], dtype=old.dtype)
                new[:, : old.shape[1]] = old
                self.arrays[name] = new

    def write(self, p: int, values: dict[str, np.ndarray]) -> None:
        """Position p of every row: values name -> (B, ...)."""
        col = p - self.start
        self._fit(col + 1, values)
        for name, v in values.items():
            self.arrays[name][:, col] = v

    def write_block(self, first: int, values: dict[str, np.ndarray]) -> None:
        """Positions first .. first + M - 1 of every row: values name -> (B, M, ...)."""
        col = first - self.start
        m = next(iter(values.values())).shape[1]
        self._fit(col + m, {name: v[:, 0] for name, v in values.items()})
        for name, v in values.items():
            self.arrays[name][:, col : col + m] = v

    def row(self, i: int, stop: int, empty: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Row i's arrays for positions start .. stop - 1 (copies); `empty` when there are none."""
        n = stop - self.start
        if n <= 0 or not self.arrays:
            return {name: v.copy() for name, v in empty.items()}
        return {name: self.arrays[name][i, :n].copy() for name in empty}

    def nbytes_per_token(self) -> int:
        """Bytes one position of one row takes in the record."""
        return sum(v.dtype.itemsize * int(np.prod(v.shape[2:], dtype=np.int64)) for v in self.arrays.values())
