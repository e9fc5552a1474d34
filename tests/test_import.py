"""What ``import tether`` costs: no HTTP, e-mail, SSL, sqlite3 or asyncio machinery until used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tether

#: stdlib machinery the core needs only when a feature is used (a webhook, an async run,
#: a SQLite ledger, a Retry-After date): its top-level package names
HEAVY = [
    "asyncio",
    "http",
    "email",
    "ssl",
    "_ssl",
    "urllib",
    "sqlite3",
    "_sqlite3",
    "socket",
    "concurrent",
    "selectors",
    "subprocess",
    "tempfile",
]


def loaded_after(code: str) -> list[str]:
    """The heavy modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return [m for m in json.loads(out.stdout) if m.split(".")[0] in HEAVY]


@pytest.mark.parametrize(
    "code",
    [
        "import tether",
        "import tether\n@tether.retry\ndef f(): return 1\nf()",
        # a whole guarded run on the defaults, sync: still none of them
        "import tether\nrun = tether.Guard().start()\nrun.proceed()\n"
        "run.call_tool('lookup', lambda q: q, {'q': 1})\nrun.succeed('done')",
        "import tether\ntether.Ledger.memory().once('k', lambda: 1)",
    ],
)
def test_the_core_loads_no_network_or_async_machinery(code: str) -> None:
    """``import tether``, a retry, a guarded run and a memory ledger load none of HEAVY."""
    assert loaded_after(code) == []


def test_the_machinery_loads_when_used() -> None:
    """The probe can fail: an async run loads asyncio, a SQLite ledger sqlite3."""
    assert "asyncio" in loaded_after(
        "import asyncio, tether\nasyncio.run(tether.RetryPolicy().acall(asyncio.sleep, 0))"
    )
    assert "sqlite3" in loaded_after("import tether\ntether.Ledger.sqlite(':memory:')")


def test_every_public_name_resolves_lazily() -> None:
    """Each name of ``__all__`` is bound at import or imported on first use, in a fresh process."""
    code = "import tether\nprint([n for n in tether.__all__ if getattr(tether, n, None) is None])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert sorted(dir(tether)) == sorted(set(dir(tether)) | set(tether.__all__))
    with pytest.raises(AttributeError, match="no attribute 'Gaurd'"):
        tether.Gaurd  # noqa: B018


def test_import_tether_loads_no_store() -> None:
    """The stores (their state machines, the token buckets) load with the first guard that
    needs one, not with ``import tether`` nor a plain retry."""
    probe = "import tether\n@tether.retry\ndef f(): return 1\nf()\nimport json, sys\n"
    probe += "print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert [m for m in json.loads(out.stdout) if m.startswith("tether.stores")] == []


#: what the first run (import, start a run, one call_tool, its end) leaves unloaded until a
#: feature needs it: ids from os.urandom (uuid imports platform), a tagged type's module
#: when a value of it is met, hmac with a signing key, genai-prices' look-up with the first
#: priced call, the records' queries with records, the checkpoint and dead-letter stores
#: (and the document stores under them) with checkpoints, the token budgets with a token
#: budget, the budget scopes' stores with scopes, fallbacks with a chain, compensations with
#: the first rollback, ``tether.Tool`` with the first tool (a call asks only ``_toolfn``),
#: hashlib (OpenSSL) once 64 KB were hashed (``tether._digest``)
FIRST_RUN_LAZY = [
    "hashlib",
    "_hashlib",
    "uuid",
    "platform",
    "decimal",
    "hmac",
    "secrets",
    "base64",
    "importlib.util",
    "tether.records._records",
    "tether.records._runs",
    "tether.records._collections",
    "tether.stores._documents",
    "tether.stores._schema",
    "tether.stores._sql",
    "tether.guards._tokens",
    "tether.guards._token_line",
    "tether.guards._token_calibration",
    "tether.stores._tokens",
    "tether.stores._scopes",
    "tether.run._fallbacks",
    "tether.run._rollback",
    "tether.run._tool",
]


def test_the_first_run_loads_what_it_uses() -> None:
    """A first guarded run on the defaults loads none of FIRST_RUN_LAZY; each loads with its
    feature (the probe can fail)."""
    code = (
        "import tether\nrun = tether.Guard().start(task='first')\n"
        "run.call_tool('lookup', lambda order: {'order': order}, {'order': 'A1'})\n"
        "run.succeed('done')\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert [m for m in FIRST_RUN_LAZY if m in json.loads(out.stdout)] == []
    # each feature loads its modules when it is first used
    features = {
        "tether.records._collections": "tether.Guard(checkpoints=tether.Checkpoints.memory())",
        "tether.guards._tokens": "tether.Guard(token_budget=tether.TokenBudget('anthropic', "
        "input_tokens_per_minute=10_000))",
        "tether.stores._scopes": "tether.BudgetScopes().limit('t', max_tokens=10)",
        "tether.run._fallbacks": "tether.Guard(fallbacks=['claude-haiku-4-5'])",
        "tether.run._rollback": "tether.Guard().start().rollback()",
        "tether.run._tool": "tether.Tool('lookup', lambda order: order)",
    }
    for module, feature in features.items():
        probe = f"import tether, sys\n{feature}\nprint({module!r} in sys.modules)"
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert out.stdout.strip() == "True", (module, out.stderr[-400:])
    code = (
        "import tether, uuid, decimal\nrun = tether.Guard(signing_key='k').start(task='t')\n"
        "a = {'id': uuid.UUID(int=1), 'amount': decimal.Decimal('1.50'), 'b': b'x'}\n"
        "print(tether.canonical_json(a))\n"
        "print(tether.PriceTable().source in ('genai-prices', 'tether'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert '"$uuid":"00000000-0000-0000-0000-000000000001"' in out.stdout
    assert '"$dec":"1.5"' in out.stdout and '"$bytes":"eA=="' in out.stdout


#: the dataclasses a first run may create: public values users replace, compare and read
#: fields of (``tether._frozen.frozen_dataclass``: none of their methods compiled); a value
#: only tether makes and reads is a plain slots class (``tether._frozen.Frozen``)
FIRST_RUN_DATACLASSES = {
    "tether.classification._classify.Verdict",
    "tether.providers._usage.RequestUsage",
    "tether.records._approvals.ApprovalRecord",
    "tether.retries._policy.RetryStats",
    "tether.run._budget.Budget",
    "tether.run._handoff.CustomerMessages",
    "tether.run._handoff.Escalation",
    "tether.run._handoff.HandoffRecord",
    "tether.run._loops.LoopPolicy",
    "tether.run._outcome.Meaning",
    "tether.run._outcome.Outcome",
    "tether.run._outcome.Usage",
    "tether.run._pricing.Price",
    "tether.run._scopes.ScopeView",
    "tether.telemetry._events.BreakerEvent",
    "tether.telemetry._events.RetryEvent",
}


def test_the_first_run_makes_no_dataclass_only_tether_reads() -> None:
    """The stores' configurations, a call's options, the compensation journal and a
    handoff's delivery are plain slots classes: the first run creates only the dataclasses
    of FIRST_RUN_DATACLASSES."""
    code = (
        "import tether\nrun = tether.Guard().start(task='first')\n"
        "run.call_tool('lookup', lambda order: {'order': order}, {'order': 'A1'})\n"
        "run.succeed('done')\nimport dataclasses, json, sys\n"
        "print(json.dumps(sorted(f'{m}.{n}' for m, mod in list(sys.modules.items())\n"
        "    if m.startswith('tether') for n, v in vars(mod).items()\n"
        "    if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == m)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert sorted(set(json.loads(out.stdout)) - FIRST_RUN_DATACLASSES) == []


def test_a_frozen_value_reads_as_the_dataclass_it_was() -> None:
    """A store's configuration compares, hashes, shows, pickles and refuses assignment as
    the frozen dataclass it replaced."""
    import copy
    import dataclasses
    import pickle

    from tether.stores._logic import BreakerConfig, BudgetConfig, config_text

    cfg = BreakerConfig(4, 30.0, 2, 0, 5, 0.5)
    same = BreakerConfig(
        failure_threshold=4, cooldown=30.0, half_open_max_calls=2, window=0, min_calls=5,
        failure_rate=0.5, probe_interval=0.0,
    )  # fmt: skip
    assert cfg == same and hash(cfg) == hash(same) and cfg != BudgetConfig(1, 2, 3, 4)
    assert cfg != BreakerConfig(4, 30.0, 2, 0, 5, 0.5, 1.0)
    assert repr(cfg) == (
        "BreakerConfig(failure_threshold=4, cooldown=30.0, half_open_max_calls=2, window=0, "
        "min_calls=5, failure_rate=0.5, probe_interval=0.0)"
    )
    assert config_text(cfg) == repr(cfg)[len("BreakerConfig(") : -1]
    assert pickle.loads(pickle.dumps(cfg)) == cfg == copy.deepcopy(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cooldown = 1.0  # type: ignore[misc]


def test_the_first_run_compiles_no_dataclass_method() -> None:
    """Python 3.11 compiles each method a dataclass makes, at import: the first run's
    dataclasses share ``__init__``, ``==``, ``hash``, ``repr`` and the frozen
    ``__setattr__`` / ``__delattr__`` (``tether._frozen.Value``; 134 compiled before #45,
    then 50)."""
    code = (
        "import sys\nmade = []\n"
        "def seen(frame, event, arg):\n"
        "    if event == 'call' and frame.f_code.co_name == '__create_fn__':\n"
        "        made.append(1)\n"
        "sys.setprofile(seen)\nimport tether\nrun = tether.Guard().start(task='first')\n"
        "run.call_tool('lookup', lambda order: {'order': order}, {'order': 'A1'})\n"
        "run.succeed('done')\nsys.setprofile(None)\nprint(len(made))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == 0


def test_a_public_value_keeps_its_dataclass_methods() -> None:
    """A public value on ``Value`` compares, hashes and shows as the frozen dataclass with
    the same fields does, and is a dataclass (``replace``, ``fields``, ``asdict``)."""
    import dataclasses

    from tether.run._outcome import Outcome, StopReason, Usage

    twin = dataclasses.make_dataclass(
        "Usage", [(f.name, f.type, f.default) for f in dataclasses.fields(Usage)], frozen=True
    )
    usage, other = Usage(steps=2, cost_usd=0.5), twin(steps=2, cost_usd=0.5)
    assert repr(usage) == repr(other) and hash(usage) == hash(other)
    assert usage == Usage(steps=2, cost_usd=0.5) != Usage(steps=3) and usage != other
    assert dataclasses.replace(usage, steps=3) == Usage(steps=3, cost_usd=0.5)
    assert dataclasses.asdict(usage) == dataclasses.asdict(other)
    outcome = Outcome("success", StopReason.GOAL_REACHED, result={"a": 1}, usage=usage)
    assert repr(outcome).startswith("Outcome(status='success', stopped_because=<StopReason.")
    assert outcome == dataclasses.replace(outcome) and outcome != dataclasses.replace(
        outcome, detail="x"
    )
    with pytest.raises(TypeError, match="unhashable"):
        hash(outcome)  # its result is a dict
    with pytest.raises(dataclasses.FrozenInstanceError):
        usage.steps = 1  # type: ignore[misc]


def test_digests_need_no_openssl_until_much_is_hashed() -> None:
    """``tether._digest`` hashes with Python's own SHA-256 until it has hashed its budget,
    then with hashlib's (OpenSSL) itself: the same digests either way."""
    code = (
        "import hashlib, sys\nsys.modules.pop('hashlib'); sys.modules.pop('_hashlib')\n"
        "from tether import _digest\nseen = []\n"
        "for n in (0, 1, 63, 64, 1000, 40_000, 40_000, 5):\n"
        "    data = bytes(range(256)) * (n // 256) + b'x' * (n % 256)\n"
        "    h = _digest.sha256(data[:7]); _digest.spend(len(data) - 7); h.update(data[7:])\n"
        "    assert h.hexdigest() == hashlib.sha256(data).hexdigest(), n\n"
        "    assert _digest.sha256(data).hexdigest() == hashlib.sha256(data).hexdigest(), n\n"
        "    seen.append(_digest.sha256 is getattr(sys.modules.get('hashlib'), 'sha256', 0))\n"
        "print(seen, '_hashlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[False, False, False, False, False, True, True, True] True"
