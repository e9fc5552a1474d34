"""Redaction: secrets out of everything tether writes or says (names, shapes in text,
personal data). The public names are in :mod:`tether`: ``redact``, ``add_secret_names``,
``add_secret_patterns``, ``register_secrets``."""
