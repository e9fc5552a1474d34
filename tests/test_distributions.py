"""The library's distributions, built by its build backend: the wheel and the source
distribution hold no benchmark code (the benchmark is the tether-bench distribution)."""

from __future__ import annotations

import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_sdist_leaves_the_benchmark_out_in_the_build_config() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    sdist = config["tool"]["hatch"]["build"]["targets"]["sdist"]
    assert "/benchmarks" in sdist["exclude"]


def _bench(names: list[str]) -> list[str]:
    return [n for n in names if "/benchmarks/" in f"/{n}" or "tether/bench/" in n]


def test_the_built_distributions_hold_no_benchmark(tmp_path: Path) -> None:
    """Built as ``python -m build`` builds them (hatchling, from this checkout)."""
    pytest.importorskip("hatchling")
    from hatchling.builders.sdist import SdistBuilder
    from hatchling.builders.wheel import WheelBuilder

    (sdist,) = SdistBuilder(str(ROOT)).build(directory=str(tmp_path))
    with tarfile.open(sdist) as archive:
        in_sdist = archive.getnames()
    (wheel,) = WheelBuilder(str(ROOT)).build(directory=str(tmp_path))
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = archive.namelist()
    assert any(n.endswith("src/tether/__init__.py") for n in in_sdist)
    assert "tether/__init__.py" in in_wheel
    assert _bench(in_sdist) == []
    assert _bench(in_wheel) == []
