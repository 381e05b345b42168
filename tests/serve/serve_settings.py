"""Sizes the serve tests share (a module of its own: ``conftest`` is a name every test folder uses)."""

TIMEOUT = 30.0
BLOCK_SIZE = 16
BLOCKS_POOL = 1024  # 4 contexts of 4,096 tokens: no test here comes near evicting another's blocks
SLOTS = 2
