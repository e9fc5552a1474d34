"""Where the state of breakers, budgets and limiters lives.

* :class:`MemoryStore` (the default): this process's memory.
* :class:`RedisStore`: shared by every process that uses the same Redis, so a fleet
  shares one breaker, one retry budget and one limiter per name.
"""

from tether.stores._base import Store
from tether.stores._memory import MemoryStore, default_store

__all__ = ["MemoryStore", "RedisStore", "Store", "default_store"]


def __getattr__(name: str) -> object:
    if name == "RedisStore":  # imported lazily: the redis package is an extra
        from tether.stores.redis._store import RedisStore

        return RedisStore
    raise AttributeError(f"module 'tether.stores' has no attribute {name!r}")
