"""tether around the official LLM SDKs: ``tether.integrations.anthropic`` and ``.openai``."""
