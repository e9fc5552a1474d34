"""Every test module that imports a framework the main venv lacks runs in that framework's venv.

ADK and Strands (with google-genai and boto3) live in ``.venv-frameworks``, CrewAI and LiteLLM in
``.venv-crewai``. A test module importing one of them at module level must be in the Makefile's
FW_TESTS or CREW_TESTS, and ignored by the main run (FW_OUT); otherwise a fresh clone's
``make test`` fails collecting it in the main venv.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("google.adk", "google.genai", "strands", "boto3", "botocore")
CREW = ("crewai", "litellm")


def _variable(makefile: str, name: str) -> str:
    match = re.search(rf"^{name} :=(.*?)(?<!\\)\n", makefile, re.MULTILINE | re.DOTALL)
    assert match, f"the Makefile has no {name}"
    return match.group(1)


def _module_level_imports(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, (ast.With, ast.If, ast.Try)):
            pending.extend(node.body)
            pending.extend(getattr(node, "orelse", []))
            for handler in getattr(node, "handlers", []):
                pending.extend(handler.body)
    return found


def _needs(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == root or module.startswith(root + ".") for root in roots)


def test_framework_tests_run_in_their_own_venv() -> None:
    makefile = (ROOT / "Makefile").read_text()
    listed = {
        "frameworks": _variable(makefile, "FW_TESTS"),
        "crew": _variable(makefile, "CREW_TESTS"),
    }
    ignored = _variable(makefile, "FW_OUT")
    misplaced = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        name = path.relative_to(ROOT).as_posix()
        imports = _module_level_imports(ast.parse(path.read_text()))
        for venv, roots in (("frameworks", FRAMEWORKS), ("crew", CREW)):
            if any(_needs(module, roots) for module in imports):
                if name not in listed[venv].split():
                    misplaced.append(f"{name}: not in the Makefile's {venv} tests")
                if f"--ignore={name}" not in ignored:
                    misplaced.append(f"{name}: not ignored by the main run (FW_OUT)")
    assert not misplaced, "\n".join(misplaced)
