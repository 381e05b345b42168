"""The lesson's block store: cached block keys in least-recently-used order, at most ``capacity`` of them.

A request walks its full prompt blocks from the start and stops at the first
miss (a chained key names the whole prefix, so nothing after a miss can match);
the last prompt token is never a hit, because the model must run on at least
one position to produce logits (``KeyedRequest.usable``). Hit blocks are
touched (moved to the young end). Every full block of prompt + answer that is
not cached yet is then added at the young end, the oldest evicted past the
capacity: answers are cached as decode fills their blocks. A block that is
already cached but was not part of the hit is left where it is, as in the
lesson (assigning an existing key of an ``OrderedDict`` keeps its position).

The store is all cache: nothing runs in it, so nothing is pinned. vLLM's pool,
where running requests hold blocks that cannot be evicted, is
``kvlab.models.prefix_cache.PrefixCache`` (the engine model of
``kvlab.fleet.simulate``).
"""

from __future__ import annotations

from collections import OrderedDict

from kvlab.fleet.keys import Key, KeyedRequest


class LruStore:
    """The lesson's block store: cached keys, oldest first, at most ``capacity`` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[Key, None] = OrderedDict()

    def serve(self, req: KeyedRequest) -> tuple[int, int]:
        """Look the prompt up, then cache prompt + answer; return (hit blocks, blocks evicted)."""
        if not self.capacity:  # every block would be added and evicted at once
            return 0, req.end
        blocks, keys = self.blocks, req.keys
        touch = blocks.move_to_end
        hit = 0
        for key in keys[: req.usable]:
            if key not in blocks:
                break  # a chained key names its whole prefix: nothing later can match
            touch(key)
            hit += 1
        evicted, size, capacity = 0, len(blocks), self.capacity
        evict = blocks.popitem
        for key in keys[hit : req.end]:
            if key not in blocks:
                blocks[key] = None
                if size < capacity:
                    size += 1
                else:
                    evict(last=False)
                    evicted += 1
        return hit, evicted
