"""tether demo tells both acts of the Northwind story and exits 0."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys


def test_demo_tells_both_acts() -> None:
    """The story runs against a real loopback service, with no API key, in seconds."""
    out = subprocess.run([sys.executable, "-m", "tether.cli", "demo"], capture_output=True, text=True, timeout=60,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Act 1" in text
    assert "Act 2" in text
    assert "closed → open" in text
    assert "run escalated: CIRCUIT_OPEN" in text
    # an outage reads as one: the trouble is ours, a person has the case, trying again may work
    assert "We're having trouble reaching one of our systems" in text
    assert "A member of our team has your case" in text
    assert "found re_0001: not paying again" in text
    assert "refunds issued for NW-1042: 1 in its records (re_0001)" in text
    assert "your refund of $49.99 was issued (reference re_0001)" in text
    assert "HTTP 503" in text  # the retries are shown to the reader ...
    customer = text.split("customer sees")[1].split("handoff")[0]
    assert "503" not in customer  # ... never to the customer


def test_demo_piped_wraps_a_long_line_under_its_text() -> None:
    """At 80 columns piped, a wrapped log line continues under its text (it restarted at
    column 0), and no line ends in spaces."""
    env = {"COLUMNS": "80", "PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "tether.cli", "demo"], capture_output=True,
                         text=True, timeout=60, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert [line for line in lines if line != line.rstrip()] == []
    wrapped = [b for a, b in itertools.pairwise(lines) if a.startswith(" 0.") and
               "issue_refund(order=NW-1042" in a and not a.rstrip().endswith(")")]  # fmt: skip
    assert wrapped, out.stdout  # the step line is longer than 80 columns
    assert all(line.startswith(" " * 18) for line in wrapped), wrapped
