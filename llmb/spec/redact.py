"""What a record must never hold: credentials, passwords in URLs, home-directory paths.

Results, conformance records and system.json are published in submission bundles, so whatever reaches them is
public. Names that look like credentials lose their value; values lose the user:password part of URLs,
`key=secret`-style pairs and the home folder of whoever ran the benchmark.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TypeVar

REDACTED = "<redacted>"
# A name holding one of these words is a credential (XLA_PASSWD, PJRT_AUTH, TORCH_HUB_CREDENTIALS, license_token).
SECRET_WORDS = (
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASS",
    "PWD",
    "AUTH",
    "CREDENTIAL",
    "LICENSE",
    "LICENCE",
    "DSN",
    "COOKIE",
    "SESSION",
    "PRIVATE",
    "SIGNATURE",
    "CERT",
)
_WORDS = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)
# scheme://user:password@host -> scheme://<redacted>@host (also a bare user@, which can be a token).
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")
# key=value or key:value pairs inside a value ("--xla_auth_token=abc", "password: hunter2").
# The separator also URL-encoded ("secret%3Dabc" in a query string held by a flag).
_PAIR = re.compile(
    rf"(?P<key>[A-Za-z0-9_.-]*(?:{'|'.join(SECRET_WORDS)})[A-Za-z0-9_.-]*\s*(?:[=:]|%3[DdAa])\s*)[^\s,;&]+", re.I
)
# A query parameter that carries a credential under a short name (an Azure SAS "sig", an OAuth "code").
_QUERY_SECRET = re.compile(r"(?P<key>[?&](?:sig|code|sas|access_token)=)[^&\s#,;]+", re.I)
# A credential word standing alone, its value the next word ("password hunter2", "token abc123").
_WORD_VALUE = re.compile(
    r"(?P<key>\b(?:password|passwd|passphrase|token|secret|api[_-]?key)[ \t]+)(?![-=:])[^\s,;&]+", re.I
)
# An AWS secret access key standing alone: 40 characters of base64 (its "/" splits it into short runs, which the
# random-run rule below would let through).
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9+/=])[A-Za-z0-9+/]{40}(?![A-Za-z0-9+/=])")
# Well-known token shapes (GitHub, Hugging Face, OpenAI-style, Slack, AWS access keys, JWTs).
_TOKENS = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,}|A[KS]IA[A-Z0-9]{16}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)"
)
_SECRET_NAME = rf"[A-Za-z0-9_.-]*(?:{'|'.join(SECRET_WORDS)})[A-Za-z0-9_.-]*"
# A quoted pair ('"token": "abc"', "'password'='x y'"): the quoted value, spaces and all.
_QUOTED_PAIR = re.compile(rf"(?P<key>[\"']{_SECRET_NAME}[\"']\s*[=:]\s*)(?:\"[^\"]*\"|'[^']*'|[^\s,;&}}]+)", re.I)
# A flag named like a secret, its value the next word ("--xla_auth_token abc", "-password hunter2").
_FLAG_VALUE = re.compile(rf"(?P<flag>(?<![^\s,;])-{{1,2}}{_SECRET_NAME}[ \t]+)[^\s-][^\s,;&]*", re.I)
# user:password@host without a scheme, and an Authorization header's credentials ("Bearer abc...").
_BARE_USERINFO = re.compile(r"(?<![\w/:@.%+-])[A-Za-z0-9._%+-]+:[^\s/@:,;<>]+@(?=[A-Za-z0-9.-])")
_AUTH_SCHEME = re.compile(r"\b(?P<scheme>Bearer|Basic|Digest|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.I)
# A long run of letters mixed with digits is what generated credentials look like (hex, base64, base62 keys); the
# names in flags and settings are words joined by _ or -, and numbers are digits only, so neither is taken.
_RANDOM_RUN = re.compile(r"[A-Za-z0-9+]{16,}")
_HOME_PATTERN = re.compile(r"(?<![\w.-])(?:/home/[^/\s:;,]+|/Users/[^/\s:;,]+|/root)(?=/|\b|$)")


def is_secret(name: str) -> bool:
    """Whether a variable or setting name looks like it holds a credential."""
    return bool(_WORDS.search(name))


def _homes() -> list[str]:
    found = {os.path.expanduser("~"), str(Path.home())}
    return sorted((h for h in found if h and h not in ("/", "~")), key=len, reverse=True)


def _mixed(run: str) -> bool:
    return any(c.isdigit() for c in run) and any(c.islower() for c in run) and any(c.isupper() for c in run)


def _random(run: str) -> bool:
    return any(c.isdigit() for c in run) and any(c.isalpha() for c in run)


def scrub(value: str) -> str:
    """A value with URL credentials, secret-looking pairs, known token shapes and home folders taken out."""
    value = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", value)
    value = _BARE_USERINFO.sub(f"{REDACTED}@", value)
    value = _AUTH_SCHEME.sub(lambda m: f"{m['scheme']} {REDACTED}", value)
    value = _QUOTED_PAIR.sub(lambda m: f"{m['key']}{REDACTED}", value)
    value = _PAIR.sub(lambda m: f"{m['key']}{REDACTED}", value)
    value = _QUERY_SECRET.sub(lambda m: f"{m['key']}{REDACTED}", value)
    value = _FLAG_VALUE.sub(lambda m: f"{m['flag']}{REDACTED}", value)
    value = _WORD_VALUE.sub(lambda m: f"{m['key']}{REDACTED}", value)
    value = _AWS_SECRET.sub(lambda m: REDACTED if _mixed(m.group()) else m.group(), value)
    value = _TOKENS.sub(REDACTED, value)
    value = _RANDOM_RUN.sub(lambda m: REDACTED if _random(m.group()) else m.group(), value)
    for home in _homes():
        value = value.replace(home, "~")
    return _HOME_PATTERN.sub("~", value)


T = TypeVar("T")


def value_for_record(name: str, value: T) -> T | str:
    """What a record keeps of one named value: nothing for a credential's name, a scrubbed text otherwise."""
    if is_secret(name):
        return REDACTED
    return scrub(value) if isinstance(value, str) else value
