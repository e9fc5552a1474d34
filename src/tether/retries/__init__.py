"""Retries: ``RetryPolicy`` and ``@retry`` (the attempt loop, sync and async), jobs that
must get done, and the spans of a retried call. The public names are in :mod:`tether`."""
