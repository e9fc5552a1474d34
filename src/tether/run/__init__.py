"""Guarded runs: ``Guard`` and ``Run`` (budgets, loop detection, the tool-call pipeline,
compensations, the ending), ``Tool``, ``Outcome``, handoffs, governance and prices. The
public names are in :mod:`tether`."""
