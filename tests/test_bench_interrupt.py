"""Ctrl-C on ``tether bench``: stopped at once, one line, exit 130, no process left.

A terminal's Ctrl-C is SIGINT to the process group. Before, ``tether bench --suite fleet``
took 99.6 s to exit (the pool's workers ran their remaining cells) and printed 3,099 lines
of tracebacks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT are POSIX")
@pytest.mark.parametrize("suite", ["fleet", "overhead"])
def test_ctrl_c_stops_the_bench_at_once_with_one_line(suite: str) -> None:
    """SIGINT to the process group mid-suite: exit 130 within seconds, one line, no child left."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks" / "src")])
    with subprocess.Popen(
        [sys.executable, "-m", "tether.cli", "bench", "--suite", suite],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        start_new_session=True,  # its own process group, as a terminal's job
    ) as bench:
        try:
            assert bench.stderr is not None
            lines = [bench.stderr.readline()]  # the suite has started (its processes too)
            assert "started" in lines[0], lines
            time.sleep(1.0)
            os.killpg(bench.pid, signal.SIGINT)
            interrupted = time.monotonic()
            _out, err = bench.communicate(timeout=60)
            took = time.monotonic() - interrupted
        finally:
            if bench.poll() is None:
                os.killpg(bench.pid, signal.SIGKILL)
    lines += err.splitlines()
    said = [line for line in lines if "(" not in line]  # less the 10-second progress lines
    assert bench.returncode == 130, err
    assert took < 10.0
    assert said[-1].startswith("tether bench: interrupted after "), lines
    assert len(said) == 2, lines  # "<suite> started", then the one line
    assert "Traceback" not in err and "Exception ignored" not in err
    with pytest.raises(ProcessLookupError):  # no worker or provider process left behind
        os.killpg(bench.pid, 0)
