"""The adapter conformance suite (#41): every adapter, through its framework's real classes
and fake models, runs the same cells (see ``suite.py``; the table is docs/integrations.md's)."""

import pytest

pytest.register_assert_rewrite("conformance.cells")
