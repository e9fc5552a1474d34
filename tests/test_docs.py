"""The examples in the README and in docs/ run: each page's python blocks in order, sharing
one namespace; the README's blocks each alone, as it says (a reader copies one block)."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
#: a block's own line that prints, at the top level (not under an ``if``)
PRINTS = re.compile(r"^print\(", re.MULTILINE)


#: pages whose every block runs on its own, in a namespace of its own
ALONE = {"README.md"}

#: pages of the extras that ``all`` leaves out: `make test` runs them in .venv-frameworks or
#: .venv-crewai, where their framework is installed (and fails there when it is not)
OUTSIDE_ALL = {
    "adk.md": "google.adk",
    "strands.md": "strands",
    "crewai.md": "crewai",
    "litellm.md": "litellm",
}

#: what those frameworks warn of on their own first use, whichever test comes first: CrewAI's
#: lazy imports (ImportWarning), LiteLLM's TypedDicts with ReadOnly items (pydantic's
#: UserWarning); their warnings, not the page's
FRAMEWORK_WARNINGS = [
    ("ignore", "", ImportWarning),
    ("ignore", ".*ReadOnly. qualifier", UserWarning),
]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_examples_run(path: Path) -> None:
    """Every ```python block of the file runs, top to bottom, sharing one namespace (the
    README's: each in a fresh one)."""
    blocks = BLOCK.findall(path.read_text())
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    with warnings.catch_warnings():
        if path.name in OUTSIDE_ALL:
            for action, message, category in FRAMEWORK_WARNINGS:
                warnings.filterwarnings(action, message, category)
            __import__(OUTSIDE_ALL[path.name])  # missing: a failure, never a skip
        for i, code in enumerate(blocks):
            if path.name in ALONE:
                namespace = {"__name__": f"docs_{path.stem}_{i}"}
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(code, f"{path.name}[block {i}]", "exec"), namespace)
            if PRINTS.search(code):  # a block that prints, unconditionally, says something
                assert printed.getvalue().strip(), f"{path.name}[block {i}] printed nothing"


def test_the_readme_first_examples_print_what_they_did() -> None:
    """The README's first block runs without a key and prints its Outcome (the blocks only
    defined run_claude_agent, run_gpt_agent and langchain_agent, never calling them)."""
    first = BLOCK.findall((ROOT / "README.md").read_text())[0]
    assert PRINTS.search(first) and "API_KEY" not in first


def test_every_guard_has_a_page() -> None:
    """One page per guard."""
    names = {p.stem for p in (ROOT / "docs").glob("*.md")}
    assert {
        "classify",
        "retry",
        "fleet",
        "effects",
        "run",
        "integrations",
        "bench",
        "telemetry",
        "thresholds",
    } <= names
