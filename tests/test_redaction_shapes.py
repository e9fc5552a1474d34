"""Secret shapes and look-alike names redacted, everyday values kept: one table each.

The shapes are those the maintained scanners know (gitleaks' rules, detect-secrets'
plugins) in the forms agents' tools print them; the rows marked ``ISSUE_39`` are the 17
that passed the redaction before (a Twilio auth token, Discord, Doppler, Notion, FCM and
age keys, prose, ``.netrc`` lines, a field named ``pass``, look-alike names). Each row
is checked as free text and, where it has one, as structured data; each kept value must
come back unchanged, as text and as a field's value.
"""

from __future__ import annotations

from typing import Any

import pytest

import tether
from tether.redaction._redact import redact_text

HEX32 = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
SID = "AC0123456789abcdef0123456789abcdef"
DISCORD_BOT = "MTA1NjQ3ODkwMTIzNDU2Nzg5MA.GaBcDe.AbCdEfGhIjKlMnOpQrStUvWxYz0123456789ab"
DOPPLER = "dp.st.prd.Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3Ab4Cd5Ef6"
NOTION = "secret_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3Ab4C"
FCM_TAIL = "APA91bHun4MxP5egoKMwt2KZFBaFUH-1RYqx1Atj0wCZWzJDTmNnBeWRZEIo19hc4xCmMeLJOD9oZ2xcLh"
FCM = "AAAAb1Cd2Ef:" + FCM_TAIL + "mhMvgkEdbwoCzfrNtNvSFkDBwmcBSJDOVqHNgNp91xmOpVoWWjsqSOzIBE"
AGE = "AGE-SECRET-KEY-1QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQS3290GG"

#: name -> (text, the secret in it, the structured form or None); ISSUE_39 names the rows
#: that passed the redaction before
SECRETS: dict[str, tuple[str, str, Any]] = {
    # the 17 of the issue
    "twilio-auth-token": (f'twilio.rest.Client("{SID}", "{HEX32}")', HEX32, None),
    "discord-bot-token": (f"discord login failed for {DISCORD_BOT}", DISCORD_BOT[-30:], None),
    "discord-webhook-url": (
        "POST https://ptb.discord.com/api/v10/webhooks/123456789012345678/"
        "AbCdEf-GhIjKlMnOpQrStUvWxYz0123456789 answered 404",
        "AbCdEf-GhIjKlMnOpQrStUvWxYz0123456789",
        None,
    ),
    "doppler-service-token": (f"doppler: 403 for {DOPPLER}", DOPPLER[10:], None),
    "notion-integration-token": (f"Notion said 401 to {NOTION}", NOTION[7:], None),
    "fcm-server-key": (f"FCM refused key={FCM}", FCM_TAIL, None),
    "age-secret-key-lower-case": (f"identity: {AGE.lower()}", AGE.lower()[16:], None),
    "prose-password-for-the-db": ("the password for the db is Hunter2xyz", "Hunter2xyz", None),
    "netrc-line": (
        "machine api.example.com login alice password s3cretNetrc",
        "s3cretNetrc",
        None,
    ),
    "field-pass": ("pass=hunter2", "hunter2", {"user": "alice", "pass": "hunter2"}),
    "spaced-passwd": ("passwd hunter2", "hunter2", None),
    "flag-password": ("mysql --password hunter2 -h db", "hunter2", None),
    "squashed-secretkey": (
        "SECRETKEY=hunter2",
        "hunter2",
        {"secretKey": "x", "secretkey": "hunter2"},
    ),
    "signing-key": ("signing_key=hunter2", "hunter2", {"signing_key": "hunter2"}),
    "php-api-key": ("['api_key' => 'hunter2']", "hunter2", None),
    "xml-password": ("<password>hunter2</password>", "hunter2", None),
    "config-add-key": ('<add key="ApiKey" value="hunter2"/>', "hunter2", None),
    # kept from before, in new forms
    "x-api-key-url-encoded": ("q=x-api-key%3Dhunter2xyz", "hunter2xyz", None),
    "discord-webhook-canary": (
        "https://canary.discordapp.com/api/webhooks/123456789012345678/AbCdEfGhIjKlMnOpQr",
        "AbCdEfGhIjKlMnOpQr",
        None,
    ),
    "doppler-cli-token": ("dp.ct." + "Ab1Cd2Ef3G" * 5, "Ab1Cd2Ef3G" * 4, None),
    "age-plugin-identity": (
        "AGE-PLUGIN-YUBIKEY-1QYQSZQGPQYQSZQGPQYQSZQGPQ",
        "QYQSZQGPQYQSZQGPQYQSZQGPQ",
        None,
    ),
    "notion-ntn": ("ntn_" + "1a2B3c4D5e" * 5, "1a2B3c4D5e" * 4, None),
    "twilio-basic-auth": (f"{SID}:{HEX32}", HEX32, None),
    "twilio-env": (f"TWILIO_TOKEN {HEX32}", HEX32, None),
    "prose-password-to-the-vault": ("password to the vault: Tr0ub4dor", "Tr0ub4dor", None),
    "prose-password-s": ("my password's Tr0ub4dor", "Tr0ub4dor", None),
    "netrc-multi-line": (
        "machine api.example.com\n  login alice\n  password hunter",
        "hunter",
        None,
    ),
    "field-db-pass": ("DB_PASS=hunter2", "hunter2", {"db_pass": "hunter2"}),
    "field-pass-phrase": ("pass_phrase=hunter2", "hunter2", {"pass_phrase": "hunter2"}),
    "field-privatekey": ("privatekey=hunter2", "hunter2", {"privatekey": "hunter2"}),
    "field-encryption-key": ("encryption_key=hunter2", "hunter2", {"encryptionKey": "hunter2"}),
    "field-master-key": ("master_key: hunter2", "hunter2", {"master_key": "hunter2"}),
    "flag-api-key": ("cli --api-key=hunter2", "hunter2", None),
    "spaced-client-secret": ("client_secret\thunter2", "hunter2", None),
    "spaced-x-api-key": ("-H x-api-key 9f8e7d", "9f8e7d", None),
}

ISSUE_39 = list(SECRETS)[:17]


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_each_secret_shape_is_redacted(name: str) -> None:
    """The secret is in no redacted form of the text or of the structured value."""
    text, secret, value = SECRETS[name]
    assert secret in text
    assert secret not in redact_text(text)
    assert secret not in repr(tether.redact({"note": text}))
    assert secret not in repr(tether.redact([text]))
    if value is not None:
        assert secret not in repr(tether.redact(value))
        assert secret not in repr(tether.redact({"nested": [value]}))


#: values that are no secret, kept as they are: ids, hashes, dates, prose about passwords
KEPT = [
    "order #W1234567 was delivered",
    "order_id=#W1234567",
    '{"order_id": "#W2378156", "item_ids": ["1008292230", "6117189161"]}',
    "order_id: W2378156",
    "user_id=sofia_rossi_8776 payment_method_id=credit_card_9513926",
    "trace 3f2b1c9e-8d4a-4f6b-9c1e-2a7d5b8e0f13",
    "uuid=3f2b1c9e-8d4a-4f6b-9c1e-2a7d5b8e0f13",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "sha1=2fd4e1c67a2d28fced849ee1bb76e7391b93eb12",
    f"md5 {HEX32}",
    "commit 2fd4e1c67a2d28fced849ee1bb76e7391b93eb12 passed",
    "created 2024-05-14",
    "at 2024-05-14T09:31:22.512Z",
    "ts: 2024-05-14T09:31:22+02:00",
    "password expires 2024-06-01",
    "password reset link sent",
    "your password expired",
    "the password policy requires 12 characters",
    "the password for the db is missing",
    "Password for the account is set",
    "my password's strength is weak",
    "pass the order to billing",
    "pass #W1234567 to returns",
    "we pass A-1001 to the warehouse",
    "the api key header is required",
    "api-key header missing",
    "secret santa list",
    "the secret to good service",
    "the token is expired",
    "login successful for machine learning team",
    "password_hint: favourite colour",
    "public_key: ssh-ed25519",
    "signing_key_id=kid_2024_05",
    "passwd file /etc/passwd",
    "AAAA batteries: 4",
    "twilio message SM0123456789abcdef0123456789abcdef delivered",
    "dp.pt. is the doppler prefix",
    "notion page secret_sauce_recipe",
    "compass heading 270, bypass=true",
    "Discord server: MyGuild",
    "session: 3 steps",
    "auth: ok",
    "pin: 94107",
    "max_tokens=1024 input_tokens: 10",
]


@pytest.mark.parametrize("text", KEPT)
def test_everyday_values_are_kept(text: str) -> None:
    """No id, hash, date or prose about passwords is redacted, as text or as a field."""
    assert redact_text(text) == text
    assert tether.redact({"note": text, "order_id": text}) == {"note": text, "order_id": text}


@pytest.mark.parametrize(
    "value",
    [
        {"pass": True, "fail": False},
        {"password_set": True},
        {"bypass": "yes", "compass": "N", "passenger": "Ann Lee", "passport_country": "PT"},
        {"signing_key_id": "kid_1", "keyboard": "us", "monkey": "see"},
    ],
)
def test_names_that_only_look_like_secrets_are_kept(value: dict[str, Any]) -> None:
    """A boolean is no secret under any name; bypass, compass, passenger are no password."""
    assert tether.redact(value) == value


def _within_screen(parsed: Any, allowed: Any) -> list[str]:
    """The parts of a parsed pattern that can match a character outside ``allowed``."""
    from re import _constants as c  # type: ignore[attr-defined]

    bad: list[str] = []
    for op, av in parsed:
        if op is c.LITERAL:
            bad += [] if allowed.fullmatch(chr(av)) else [chr(av)]
        elif op is c.IN:
            for item, value in av:
                if item is c.LITERAL:
                    bad += [] if allowed.fullmatch(chr(value)) else [chr(value)]
                elif item is c.RANGE:
                    chars = map(chr, range(value[0], value[1] + 1))
                    bad += [ch for ch in chars if not allowed.fullmatch(ch)]
                elif item is not c.CATEGORY or value not in (c.CATEGORY_WORD, c.CATEGORY_DIGIT):
                    bad.append(f"{item} {value}")
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
            bad += _within_screen(av[2], allowed)
        elif op is c.SUBPATTERN:
            bad += _within_screen(av[3], allowed)
        elif op is c.BRANCH:
            for branch in av[1]:
                bad += _within_screen(branch, allowed)
        elif op not in (c.ASSERT, c.ASSERT_NOT, c.AT):  # zero width
            bad.append(f"{op} {av}")
    return bad


def test_every_key_shape_matches_within_the_screens_run() -> None:
    """The screen that spares a text the shapes' pattern lets every shape through: each
    shape matches only characters of the screen's run, and at least as many as it asks."""
    import re
    from re import _parser  # type: ignore[attr-defined]

    from tether.redaction import _secret_text

    least = int(_secret_text._SHAPE_RUN.rpartition("{")[2].rstrip(",}"))
    allowed = re.compile(_secret_text._SHAPE_RUN.partition("{")[0])
    for shape in _secret_text._SHAPES:
        parsed = _parser.parse(shape)
        assert parsed.getwidth()[0] >= least, shape
        assert _within_screen(parsed, allowed) == [], shape


def test_a_text_with_no_long_run_compiles_no_shape() -> None:
    """Prose and short values are redacted without compiling the shapes' pattern (the
    costliest to compile): a first run's transcript pays nothing for it."""
    import subprocess
    import sys

    code = (
        "from tether.redaction._redact import redact\n"
        "from tether.redaction import _secret_text as t\n"
        "redact({'order': 'A1', 'note': 'the parcel left Lisbon on Monday at noon'})\n"
        "print(sorted(t._compiled()), sorted(vars(t._P)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "'shapes'" not in out.stdout and "'SHAPE_RUN'" in out.stdout
