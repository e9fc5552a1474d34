"""At-most-once side effects: canonical encoding and intent keys, the result codec, the
``Ledger`` and ``tether.wrap`` for connector SDKs. The public names are in :mod:`tether`."""
