"""The fleet-level guards: circuit breaker, retry budget and adaptive limiter, whose state
lives in a store (:mod:`tether.stores`). The public names are in :mod:`tether`."""
