"""The paged cache's block accounting: which blocks are free, which sequence holds which."""

from __future__ import annotations

import math
from collections import deque


class BlockAllocator:
    """``num_blocks`` blocks of ``block_size`` slots; a sequence's block table grows one
    block at a time as its tokens need slots, and is given back whole when the sequence
    finishes, is cancelled or is preempted."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"--num-blocks and --block-size must be >= 1, got {num_blocks} and {block_size}"
            )
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` slots."""
        return math.ceil(num_tokens / self.block_size)

    def grow(self, table: list[int], num_tokens: int) -> bool:
        """Extend ``table`` in place to hold ``num_tokens`` slots; False (table unchanged)
        when there are not enough free blocks."""
        missing = self.blocks_for(num_tokens) - len(table)
        if missing > len(self._free):
            return False
        table.extend(self._free.popleft() for _ in range(max(missing, 0)))
        return True

    def release(self, table: list[int]) -> None:
        """Give every block of ``table`` back and empty it."""
        self._free.extend(table)
        table.clear()
