"""The layout: data flows down the layers, never up (CONTRIBUTING.md, "Layout")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tether"
#: tether.bench, in a distribution of its own (benchmarks/): the same layers hold for it
BENCH = ROOT / "benchmarks" / "src" / "tether"

#: the layers, from the bottom up; a module may import from its own layer and those below
LAYERS = [
    [
        "tether._errors",
        "tether._digest",
        "tether._frozen",
        "tether.redaction",
        "tether._version",
        "tether._context",
    ],
    ["tether.clock", "tether._sansio"],
    ["tether.classification", "tether.backoff", "tether.providers"],
    ["tether.telemetry", "tether.stores"],
    ["tether.guards"],
    ["tether.retries"],
    ["tether.effects"],
    ["tether.records"],
    ["tether.run", "tether.policies"],
    ["tether.integrations"],
    ["tether.cli", "tether.bench", "tether.serve", "tether.testing"],
]


def layer_of(module: str) -> int | None:
    """The layer of a module: that of the longest layer prefix it falls under."""
    found = [
        (len(prefix), i)
        for i, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(found)[1] if found else None


def modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in sorted([*SRC.rglob("*.py"), *BENCH.rglob("*.py")]):
        base = SRC.parent if path.is_relative_to(SRC) else BENCH.parent
        parts = list(path.relative_to(base).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imports(module: str, path: Path, is_package: bool, known: set[str]) -> list[tuple[str, int]]:
    """Every tether module ``module`` imports: at the top, in functions, under TYPE_CHECKING."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.append((name if name in known else base, node.lineno))
    return [(name, line) for name, line in found if name.startswith("tether.")]


def test_every_module_has_a_layer() -> None:
    """A new module or folder is placed in a layer (here and in CONTRIBUTING.md)."""
    assert [m for m in modules() if m != "tether" and layer_of(m) is None] == []


def test_no_module_imports_from_a_layer_above_it() -> None:
    """Data flows down: no import (top level, local or TYPE_CHECKING) reaches up a layer."""
    known = modules()
    upward = [
        f"{module}:{line} imports {target}"
        for module, (path, is_package) in known.items()
        if module != "tether"
        for target, line in imports(module, path, is_package, set(known))
        if (layer_of(target) or 0) > (layer_of(module) or 0)
    ]
    assert upward == []


@pytest.mark.parametrize("layer", ["tether.integrations", "tether.cli", "tether.serve"])
def test_import_tether_does_not_import_the_shells(layer: str) -> None:
    """``import tether`` loads the core only: no integration, no command line."""
    code = f"import sys, tether; print(sorted(m for m in sys.modules if m.startswith({layer!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_library_holds_no_benchmark() -> None:
    """The benchmark is the tether-bench distribution (benchmarks/): none of it under src/."""
    assert not (SRC / "bench").exists()
    assert any(m.startswith("tether.bench.") for m in modules())


def test_the_bench_extra_names_only_the_bench_distribution() -> None:
    """`tether[bench]` installs tether-bench and nothing else; `tether[all]` leaves it out."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["bench"] == ["tether-bench"]
    assert "bench" not in extras["all"][0]
    bench = tomllib.loads((ROOT / "benchmarks" / "pyproject.toml").read_text())
    assert bench["project"]["name"] == "tether-bench"
    assert bench["tool"]["hatch"]["build"]["targets"]["wheel"]["only-include"] == [
        "src/tether/bench"
    ]
