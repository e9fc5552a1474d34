"""One driver per adapter (a framework's real agent, its own fake model); registered in
``conformance/registry.py``."""
