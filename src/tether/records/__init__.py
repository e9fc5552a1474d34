"""Durable records of runs: checkpoints, dead letters, handoffs, approvals and run
records (``Records``), with their retention. The public names are in :mod:`tether`."""
