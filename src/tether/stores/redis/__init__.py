"""The Redis backends: the store of breakers, budgets and limiters, and the ledger's.
``tether.stores.RedisStore`` and ``tether.Ledger.redis`` are the public names."""
