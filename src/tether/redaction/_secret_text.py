"""Secrets in free text: key shapes, private keys, credentialed URLs, ``name=value`` pairs,
"my password is ...", auth schemes, card numbers; e-mail addresses and phone numbers."""

from __future__ import annotations

import re
from typing import Any

from tether.redaction._secret_names import (
    REDACTED,
    _extra_patterns,
    _fragments,
    _looks_secret,
    _normalise,
    _state,
    _tier,
    _words,
)

EMAIL_MASK = "[email]"


PHONE_MASK = "[phone]"


_PEM = (  # gitleaks private-key; detect-secrets PrivateKeyDetector
    r"-----BEGIN[ A-Z0-9_-]{0,40}PRIVATE KEY(?: BLOCK)?-----"
    r"(?:[\s\S]*?-----END[ A-Z0-9_-]{0,40}PRIVATE KEY(?: BLOCK)?-----|[\s\S]*)"
    r"|PuTTY-User-Key-File-\d[\s\S]*?Private-MAC: *\w+"
)


_SHAPES = [
    r"sk-ant-[\w-]{16,}",  # anthropic-api-key, anthropic-admin-api-key
    r"sk-(?:proj-|svcacct-|admin-)?[\w-]{20,}",  # openai-api-key
    r"[sr]k_(?:live|test|prod)_[A-Za-z0-9]{10,}",  # stripe-access-token
    r"pk_live_[A-Za-z0-9]{10,}",
    r"whsec_[A-Za-z0-9]{16,}",
    r"gh[pousr]_[A-Za-z0-9]{20,}",  # github-pat, -oauth, -app-token, -refresh-token
    r"github_pat_\w{20,}",  # github-fine-grained-pat
    r"gl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|agent|oas|ffct)-[\w-]{20,}(?:\.[\w-]+)?",  # gitlab-*
    r"GR1348941[\w-]{20,}",  # gitlab-rrt
    r"xox[abposre]-[\w-]{10,}",  # slack-bot-token, -user-token, -legacy-*
    r"xapp-\d-[\w-]{10,}",  # slack-app-token
    r"hooks\.slack\.com/(?:services|workflows|triggers)/[\w+/-]{8,}",  # slack-webhook-url
    r"discord(?:app)?\.com/api/(?:v\d+/)?webhooks/\d+/[\w-]+",  # discord-webhook (ptb., canary.)
    r"[MNO][A-Za-z\d_-]{23,27}\.[\w-]{6,7}\.[\w-]{27,40}",  # discord bot token (detect-secrets)
    r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|ROA|NPA|NVA|IPA|3T[A-Z0-9])[A-Z0-9]{16}(?![A-Z0-9])",  # aws-access-token
    r"AIza[\w-]{35}",  # gcp-api-key
    r"GOCSPX-[\w-]{20,}",  # Google OAuth client secret
    r"ya29\.[\w-]{20,}",  # Google OAuth access token
    r"eyJ[\w-]{5,}\.eyJ[\w-]{5,}\.[\w-]{5,}",  # jwt
    r"npm_[A-Za-z0-9]{36}",  # npm-access-token
    r"hf_[A-Za-z0-9]{30,}",  # huggingface-access-token
    r"api_org_[A-Za-z0-9]{30,}",  # huggingface-organization-api-token
    r"SG\.[\w-]{16,}\.[\w-]{16,}",  # sendgrid-api-token
    r"AC[0-9a-fA-F]{32}(?![0-9a-fA-F])",  # Twilio account SID (detect-secrets TwilioKeyDetector)
    r"SK[0-9a-fA-F]{32}(?![0-9a-fA-F])",  # twilio-api-key
    r"pypi-AgE[\w-]{50,}",  # pypi-upload-token
    r"do[por]_v1_[a-f0-9]{64}",  # digitalocean-pat, -access-token, -refresh-token
    r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}",  # shopify-*
    r"dapi[a-f0-9]{32}",  # databricks-api-token
    r"glc_[A-Za-z0-9+/]{32,}={0,3}",  # grafana-cloud-api-token
    r"glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}",  # grafana-service-account-token
    r"hv[sb]\.[\w-]{90,}",  # vault-service-token, vault-batch-token
    r"pplx-[A-Za-z0-9]{40,}",  # perplexity-api-key
    r"gsk_[A-Za-z0-9]{40,}",  # groq
    r"lin_api_[A-Za-z0-9]{40}",  # linear-api-key
    r"PMAK-[a-fA-F0-9]{24}-[a-fA-F0-9]{34}",  # postman-api-token
    r"sntry[su]_[\w+/=]{40,}",  # sentry-user-token, sentry-org-token
    r"dp\.(?:pt|st|ct|sa|scim|audit)\.(?:[\w-]{1,40}\.)?[A-Za-z0-9]{40,}",  # doppler-*-token
    r"AGE-SECRET-KEY-1[0-9A-Z]{58}",  # age-secret-key
    r"age-secret-key-1[0-9a-z]{58}",  # the same, lower-case (bech32 reads either)
    r"AGE-PLUGIN-[A-Z0-9]+-1[0-9A-Z]{20,}",  # an age plugin's identity
    r"AAAA[\w-]{7}:[\w-]{100,}",  # Firebase Cloud Messaging server key
    r"sq0(?:atp|csp)-[\w-]{22,}",  # square-access-token (detect-secrets SquareOAuthDetector)
    r"key-[a-f0-9]{32}",  # mailgun-private-api-token
    r"ATATT3[\w=-]{50,}",  # atlassian-api-token
    r"HRKU-AA[\w-]{58}",  # heroku-api-key-v2
    r"xkeysib-[a-f0-9]{64}-[A-Za-z0-9]{16}",  # sendinblue-api-token
    r"rubygems_[a-f0-9]{48}",  # rubygems-api-token
    r"pul-[a-f0-9]{40}",  # pulumi-api-token
    r"pnu_[A-Za-z0-9]{36}",  # prefect-api-token
    r"ops_eyJ[\w+/]{100,}={0,3}",  # 1password-service-account-token
    r"LTAI[A-Za-z0-9]{20}",  # alibaba-access-key-id
    r"EAA[MC][A-Za-z0-9]{100,}",  # facebook-page-access-token
    r"AKCp[A-Za-z0-9]{60,}",  # artifactory-api-key
    r"ntn_[A-Za-z0-9]{40,}",  # notion-api-token
    r"secret_[A-Za-z0-9]{43}(?![A-Za-z0-9])",  # Notion's integration token before ntn_
    r"sha256~[\w-]{43}",  # openshift-user-token
]


# shapes that begin with no fixed prefix (tried only when their marker is in the text)
_LOOSE_SHAPES = [
    (
        ".webhook.office.com",
        r"[\w-]+\.webhook\.office\.com/webhookb2/[^\s\"'<>]+",
    ),  # microsoft-teams
    (r"Q~", r"[\w~.]{3}\dQ~[\w~.-]{31,34}"),  # azure-ad-client-secret
    (r"-us", r"[0-9a-f]{32}-us\d{1,2}"),  # mailchimp-api-key
    (r":AA", r"\d{8,10}:AA[\w-]{33}"),  # telegram-bot-api-token
]


# shapes that are secrets only beside their context (contexts, markers, the shape): a Twilio
# auth token is 32 hex digits, like any MD5, and is one only where Twilio or an account SID is
_CONTEXT_SHAPES = [
    (
        ("wilio", "WILIO", "AC"),
        r"[Tt]wilio|TWILIO|(?<![A-Za-z0-9])AC[0-9a-fA-F]{32}(?![0-9a-fA-F])",
        r"(?<![0-9A-Za-z])[0-9a-fA-F]{32}(?![0-9A-Za-z])",
    ),
]


# user:password@host:port of a URL: the host of a credentialed URL (a DSN) goes too
_URL_CREDENTIALS = r"(?<=://)[^/\s@:\"'<>]*:[^/\s@\"'<>]*@[^/\s?#\"'<>]*"


# https://TOKEN@host: a token given as the URL's user
_URL_TOKEN = r"(?<=://)[^/\s@:\"'<>\[]{6,}(?=@)"


_URL_USER = r"(?<=://)[^/@\s]*@"


# the rules below read a lower-cased copy of the text (case-insensitive patterns are slow)
_AUTH_SCHEME = r"(bearer|basic|digest|token|bot)(\s+)([a-z0-9._~+/=-]{6,})"


# after a secret's name (found by its last part, see _fragments): the separator and the value
# of name=value, name: value, "name": "value", name='value' (reprs), ?name=value, and
# ("name", "value") pairs
_PAIR_TAIL = (
    r"([\"']?)(\s*(?:=>|[:=]|%3[Dd])\s*|\s*,\s*)((?:[Bb]earer|[Bb]asic|[Dd]igest|[Tt]oken|BEARER|BASIC)\s+)?"
    r"(\[redacted\]|\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s\"'&,;)}\]<>]+)"
)


_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


# {"name": "api_key", "value": "..."}: a secret named in one field, its value in the next;
# also as attributes: <add key="ApiKey" value="..."/>
_NAMED_VALUE = (
    r"([\"']?)(?:name|key|header|field)\1\s*[:=]\s*([\"'])([\w.-]{1,60})\2(?:\s*,\s*|\s+)"
    r"([\"']?)value\4\s*[:=]\s*(\[redacted\]|\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s\"',;)}\]]+)"
)


# what a secret is for, in prose: "for the db", "to the admin account"
_QUALIFIER = (
    r"\s+(?:for|to|of|on)\s+(?:(?:the|my|our|your|this|that|an?)\s+)?[\w.@/:-]{1,60}"
    r"(?:\s+(?:account|server|database|db|user|box|host|vault|instance|site|app))?"
)


# "my password is hunter2", "the api key was sk-...", "the password for the db is X",
# "my password's X", "the password to the vault: X"
_SAID = (
    r"(pass(?:word|code|phrase)|passwd|pin(?: code)?|secret|api[ _-]?key|access key|token|otp)"
    rf"((?:{_QUALIFIER})?(?:\s+(?:is|was|=)\s+|'s\s+|\s+is:\s+)|(?:{_QUALIFIER})\s*:\s+)"
    r"[\"']?([^\s\"',;]+)"
)


# a secret's name and its value with only blanks between (``passwd hunter2``,
# ``--api-key 9f8e...``): read for the names of :func:`_spaced_name`, the value judged by
# :func:`_spaced_value`
_SPACED_TAIL = r"([ \t]+)([^\s\"'&,;)}\]<>]+)"


# values after a secret's name that are no secret: dates and ISO timestamps, a retail id
_NOT_A_VALUE = r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?|#?[A-Z]\d{5,}"


# a .netrc's (or an FTP script's) ``machine h login u password p``: any p is the password
_NETRC = r"(?<![\w-])(?:password|passwd)[ \t]+(\S+)"


# <password>hunter2</password>: an element named a secret
_ELEMENT = r"<([A-Za-z_][\w.:-]{0,60})>([^<]{1,200})</\1>"


_PLAIN_WORDS = _words(
    "a an the not no too very now still also already being been set reset changed wrong"
    " incorrect invalid expired required missing empty blank null none correct valid weak"
    " strong needed incomplete ok fine same different case sensitive in on at of for and"
    " or out here there unknown unavailable revoked rotated stored hidden redacted"
)


# a candidate card number: a whole token of 13 to 19 digits, or grouped as cards print
_CARD = (
    r"\d(?:\d{12,18}|\d{3}([ -])\d{4}(?:\1\d{4}){1,2}(?:\1\d{1,3})?|\d{3}([ -])\d{6}\2\d{4,5})"
    r"(?![\w-])"
)


_CARD_WORDS = r"card|credit|debit|visa|master|amex|\bcc\b|\bpan\b|paid with"


_ID_WORDS = (
    r"order|invoice|ticket|track|ref|\bid\b|_id\b|\bids\b|#|\bno\.|time|\bts\b|\bat\b|epoch|"
    r"nanos|\bns\b|trace|span|sku|barcode|ean|isbn|imei|iccid|seq"
)


_EMAIL = r"[A-Za-z0-9][\w.+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])"


_PHONE_INTL = r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?![\w-])"  # +351 912 345 678


_PHONE_NANP = r"(?:\(\d{3}\)\s?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\w-])"  # (415) 555-0100


_PHONE_NAMED = (  # phone: 912345678 (on the lower-cased text)
    r"(?:phone|tel|mobile|cell|sms|whatsapp|fax)[\s:=#.\"']{1,4}(\+?\d[\d ().-]{5,16}\d)"
)


# a run of 14 or more characters a key shape can be made of: every shape above matches
# within one (tests/test_secrets.py reads each shape's parts to check), so a text with no
# such run skips the shapes' pattern, the costliest to compile and to run
_SHAPE_RUN = r"[\w.~+/=:-]{14,}"


class _Patterns:
    """The rules above, each compiled when a text first needs it (``_P.CARD`` is
    ``_CARD`` compiled): a process whose texts meet a rule's pattern compiles it, one that
    redacts only short or plain texts compiles none of them."""

    def __getattr__(self, name: str) -> re.Pattern[str]:
        pattern = re.compile(globals()[f"_{name}"])
        setattr(self, name, pattern)  # read from the instance from now on
        return pattern


_P = _Patterns()


class _Compiled(dict[str, Any]):
    """The patterns that change with the user's additions, each built when first read;
    also what the texts redacted to with them (``memo``): all made anew when they change."""

    def __missing__(self, key: str) -> Any:
        if key == "shapes":
            value: Any = re.compile(rf"(?<![A-Za-z0-9])(?:{'|'.join(_SHAPES)})")
        elif key == "loose":
            value = [re.compile(rf"(?<![\w~.]){p}") for _, p in _LOOSE_SHAPES]
        elif key == "context":
            value = [(re.compile(c), re.compile(p)) for _, c, p in _CONTEXT_SHAPES]
        elif key == "extra":
            extra = "|".join(f"(?:{p.pattern})" for p in _extra_patterns)
            value = re.compile(extra) if extra else None
        elif key == "fragments":
            value = _fragments()
        elif key == "memo":
            value = {}
        else:
            raise KeyError(key)
        self[key] = value
        return value


def _compiled() -> dict[str, Any]:
    """The patterns that change with the user's additions (see :class:`_Compiled`)."""
    found = _state.get("compiled")
    if found is None:
        found = _state["compiled"] = _Compiled()
    return found


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _issued(d: str) -> bool:
    """A number of a card issuer's range, with a length that issuer prints."""
    n, p2, p3, p4 = len(d), int(d[:2]), int(d[:3]), int(d[:4])
    if d[0] == "4":  # Visa
        return n in (13, 16, 19)
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:  # Mastercard
        return n == 16
    if p2 in (34, 37):  # American Express
        return n == 15
    if 2200 <= p4 <= 2204:  # Mir
        return 16 <= n <= 19
    if 3528 <= p4 <= 3589:  # JCB
        return 16 <= n <= 19
    if p2 in (36, 38, 39) or 300 <= p3 <= 305 or p4 == 3095:  # Diners Club
        return 14 <= n <= 19
    if d[0] == "6":  # Discover, UnionPay, Maestro, RuPay
        return 16 <= n <= 19
    if p2 == 50 or 56 <= p2 <= 58:  # Maestro
        return 13 <= n <= 19
    return n == 16 and (p2 in (81, 82) or p4 == 9792)  # RuPay, Troy


def _word_before(text: str, at: int) -> bool:
    """Whether ``text[at]`` continues a word (so a match there is no whole token)."""
    return at > 0 and (text[at - 1].isalnum() or text[at - 1] in "_.-")


def _cards(text: str, context: str) -> str:
    if _P.CARD.search(text) is None:
        return text

    def card(m: re.Match[str]) -> str:
        if _word_before(text, m.start()):
            return m.group(0)
        digits = m.group(0).replace(" ", "").replace("-", "")
        if not (13 <= len(digits) <= 19 and _issued(digits) and _luhn(digits)):
            return m.group(0)
        before = f"{context} {text[max(0, m.start() - 32) : m.start()]}".lower()
        # the word nearest the number says what it is: "card 4242..., order 4539..."
        card_at = max((w.end() for w in _P.CARD_WORDS.finditer(before)), default=-1)
        id_at = max((w.end() for w in _P.ID_WORDS.finditer(before)), default=-1)
        return m.group(0) if id_at > card_at else REDACTED  # an order number, a timestamp

    return _P.CARD.sub(card, text)


def _quoted(value: str) -> str:
    """``[redacted]`` in the quotes ``value`` had."""
    q = value[0] if value[:1] in ("'", '"') else ""
    return f"{q}{REDACTED}{q}"


def _done(value: str) -> bool:
    return value == REDACTED or value[1:-1] == REDACTED


def _pairs(
    text: str,
    low: str,
    fragments: re.Pattern[str],
    hit: re.Match[str] | None,
    spans: list[tuple[int, int, str]],
) -> None:
    """``name=value`` pairs of the secret names: each hit of a name's last part (the first
    is ``hit``) is widened to the whole name, then the separator and the value after it
    are read."""
    while hit is not None:
        hit = fragments.search(low, _pair(text, hit, spans))


def _pair(text: str, hit: re.Match[str], spans: list[tuple[int, int, str]]) -> int:
    """The pair of the name ``hit`` is part of, if it is one; where to look on."""
    start, end, n = hit.start(), hit.end(), len(text)
    while start > 0 and text[start - 1] in _KEY_CHARS:
        start -= 1
    while end < n and text[end] in _KEY_CHARS:
        end += 1
    flag = text[start] == "-"
    while start < end and text[start] == "-":  # --password=...: the flag's name
        start += 1
    if not (text[start].isalpha() or text[start] == "_"):
        return end
    tail = _P.PAIR_TAIL.match(text, end)
    if tail is None:
        if end < n and text[end] in " \t":
            _spaced(text, start, end, flag, spans)
        return end
    quote, sep, _, value = tail.groups()
    if quote and (start == 0 or text[start - 1] != quote):
        return end
    if _done(value) or ("," in sep and not _pair_in_list(text, quote, value, tail.end())):
        return end  # done already; a list of words, not ("name", "value")
    tier = _tier(text[start:end])
    if tier == 2 or (tier == 1 and _looks_secret(value)):
        spans.append((tail.start(4), tail.end(4), _quoted(value)))
    return tail.end()


def _spaced(text: str, start: int, end: int, flag: bool, spans: list[tuple[int, int, str]]) -> None:
    """``passwd hunter2``, ``--pass hunter2``: a secret's name (a command's flag: any
    secret's name), blanks, and a value that looks like one."""
    tail = _P.SPACED_TAIL.match(text, end)
    name = text[start:end]
    if tail is None or not (_tier(name) == 2 if flag else _spaced_name(name)):
        return
    value = tail.group(2).rstrip(".!?:")
    if _spaced_value(value):
        spans.append((tail.start(2), tail.start(2) + len(value), REDACTED))


def _spaced_name(name: str) -> bool:
    """A name whose value may follow it after a blank: a password's, or a compound secret's
    name (``api_key``, ``X-Api-Key``, ``client_secret``); not ``pass``, ``secret`` or
    ``token`` alone (words of prose: "pass A-1001 to billing")."""
    if _tier(name) != 2:
        return False
    n = _normalise(name)
    return "_" in n or n in _SPACED_WORDS


_SPACED_WORDS = _words("password passwd passphrase passcode apikey secretkey privatekey")


def _spaced_value(value: str) -> bool:
    """A value after a blank that is a secret: not a word of prose, a date or an id."""
    if len(value) < 4 or value.lower() in _PLAIN_WORDS or _P.NOT_A_VALUE.fullmatch(value):
        return False
    if value.isdigit():
        return True  # a PIN, a numeric password
    if value.isalpha():
        return len(value) >= 16 or not (value.islower() or value[1:].islower())
    return any(c.isalpha() for c in value) or len(value) >= 8


def _pair_in_list(text: str, quote: str, value: str, end: int) -> bool:
    """``("X-Api-Key", "abc")``: quoted name and value, the value not the next field's name
    (``"name": "api_key", "value": ...``)."""
    if not (quote and value[:1] in "'\""):
        return False
    rest = text[end : end + 8].lstrip()
    return not rest.startswith((":", "="))


def _named_values(text: str, low: str, spans: list[tuple[int, int, str]]) -> None:
    for m in _P.NAMED_VALUE.finditer(low):
        value = text[m.start(5) : m.end(5)]
        if _tier(text[m.start(3) : m.end(3)]) and not _done(value):
            spans.append((m.start(5), m.end(5), _quoted(value)))


def _netrc(text: str, low: str, spans: list[tuple[int, int, str]]) -> None:
    for m in _P.NETRC.finditer(low):
        value = text[m.start(1) : m.end(1)]
        if not _done(value):
            spans.append((m.start(1), m.end(1), REDACTED))


def _elements(text: str, spans: list[tuple[int, int, str]]) -> None:
    for m in _P.ELEMENT.finditer(text):
        value, tier = m.group(2), _tier(m.group(1))
        secret = tier == 2 or (tier == 1 and _looks_secret(value))
        if secret and value.strip() and not _done(value):
            spans.append((m.start(2), m.end(2), REDACTED))


def _said(text: str, low: str, spans: list[tuple[int, int, str]]) -> None:
    for m in _P.SAID.finditer(low):
        if m.start() > 0 and low[m.start() - 1].isalnum():
            continue
        said = text[m.start(3) : m.end(3)]
        value = said.rstrip(".!?):")
        if not value or value == REDACTED or value.lower() in _PLAIN_WORDS:
            continue
        weak = m.group(1).startswith(("pin", "token", "otp"))
        if weak and not (_looks_secret(value) or (value.isdigit() and 4 <= len(value) <= 8)):
            continue
        if m.group(2).startswith("'s") and not _spaced_value(value):
            continue  # "my password's strength is weak"
        spans.append((m.start(3), m.start(3) + len(value), REDACTED))


def _schemes(text: str, low: str, spans: list[tuple[int, int, str]]) -> None:
    for m in _P.AUTH_SCHEME.finditer(low):
        value = text[m.start(3) : m.end(3)]
        # "Bearer abc.def" is a credential, "basic details" is not
        if (m.start() == 0 or not low[m.start() - 1].isalnum()) and (
            not value.isalpha() or len(value) >= 16
        ):
            spans.append((m.start(3), m.end(3), REDACTED))


def _apply(text: str, spans: list[tuple[int, int, str]]) -> str:
    """``text`` with the spans replaced (the first of overlapping ones wins)."""
    out, last = [], 0
    for start, end, new in sorted(spans):
        if start >= last:
            out.append(text[last:start])
            out.append(new)
            last = end
    out.append(text[last:])
    return "".join(out)


def _url_credentials(m: re.Match[str]) -> str:
    return m.group(0) if m.group(0).startswith(REDACTED) else REDACTED


def _phone(m: re.Match[str]) -> str:
    digits = sum(c.isdigit() for c in m.group(0))
    return PHONE_MASK if 7 <= digits <= 15 else m.group(0)


def _lower(text: str) -> str:
    """``text`` lower-cased, each character in its place (what the pattern rules read)."""
    low = text.lower()
    if len(low) == len(text):
        return low
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)  # İ and the like


#: texts up to this long are remembered with what they redact to (at most _MEMO_SIZE of
#: them): a run's arguments and results repeat their names, ids and phrases from call to
#: call, and each is scanned once
_MEMO_TEXT = 512
_MEMO_SIZE = 8192


def _text(text: str, pii: bool, context: str) -> str:
    compiled = _compiled()
    if len(text) > _MEMO_TEXT:
        return _scan(text, pii, context, compiled)
    memo: dict[tuple[str, bool, str], str] = compiled["memo"]
    key = (text, pii, context)
    found = memo.get(key)
    if found is None:
        found = _scan(text, pii, context, compiled)
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        memo[key] = found
    return found


def _scan(text: str, pii: bool, context: str, compiled: dict[str, Any]) -> str:
    if "-----BEGIN" in text or "PuTTY-User-Key" in text:
        text = _P.PEM.sub(REDACTED, text)
    if "://" in text:
        text = _P.URL_CREDENTIALS.sub(_url_credentials, text)
        text = _P.URL_TOKEN.sub(REDACTED, text)
    if len(text) >= 32:
        for i, (markers, _, _) in enumerate(_CONTEXT_SHAPES):
            for marker in markers:
                if marker in text:
                    near, pattern = compiled["context"][i]
                    if near.search(text):
                        text = pattern.sub(REDACTED, text)
                    break
    if len(text) >= 14:
        if _P.SHAPE_RUN.search(text) is not None:
            text = compiled["shapes"].sub(REDACTED, text)
        for i, (marker, _) in enumerate(_LOOSE_SHAPES):
            if marker in text:
                text = compiled["loose"][i].sub(REDACTED, text)
    if compiled["extra"] is not None:
        text = compiled["extra"].sub(REDACTED, text)
    low = _lower(text)
    spans: list[tuple[int, int, str]] = []
    fragments = compiled["fragments"]
    hit = fragments.search(low)
    if hit is not None:  # a secret's name (a part of one) is in the text
        _pairs(text, low, fragments, hit, spans)
        if "value" in low:
            _named_values(text, low, spans)
        if " is " in low or " was " in low or " = " in low or "'s " in low or ": " in low:
            _said(text, low, spans)
        if "login" in low or "machine" in low:
            _netrc(text, low, spans)
        if "</" in text:
            _elements(text, spans)
    if "bearer" in low or "basic" in low or "digest" in low or "token" in low or "bot" in low:
        _schemes(text, low, spans)
    if spans:
        text = _apply(text, spans)
    if len(text) >= 13:
        text = _cards(text, context)
    if pii:
        if "@" in text:
            text = _P.EMAIL.sub(
                lambda m: m.group(0) if _word_before(text, m.start()) else EMAIL_MASK, text
            )
        if "+" in text:
            text = _P.PHONE_INTL.sub(_phone, text)
        text = _P.PHONE_NANP.sub(_phone, text)
        low = _lower(text)
        if any(w in low for w in ("phone", "tel", "mobile", "cell", "sms", "whatsapp", "fax")):
            text = _apply(
                text,
                [
                    (m.start(1), m.end(1), PHONE_MASK)
                    for m in _P.PHONE_NAMED.finditer(low)
                    if 7 <= sum(c.isdigit() for c in m.group(1)) <= 15
                ],
            )
    return text
