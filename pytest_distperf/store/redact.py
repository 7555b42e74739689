"""The one redaction of secrets before anything reaches an output (reports, history, PR comment, terminal, logs).

Masked: a URL's password (the user stays: it says which account, as SQLAlchemy's `hide_password` does); the
value of a `name=value` whose name looks like a secret (URL queries, command-line assignments, environment
variables); the argument after an option whose name looks like one (`--token VALUE`). A name looks like a secret
when one of its parts (split at `_`, `-`, `.`) is, or ends with, one of SECRET_WORDS: `HF_TOKEN`, `db.password`,
`apikey`, not `tokens_per_s` or `PWD`.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

MASK = "***"
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PASSPHRASE", "PW", "KEY", "APIKEY",
                "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "AUTHORIZATION", "COOKIE", "SESSIONID", "PRIVATE",
                "SIGNATURE", "CERT", "SAS")
_NOT_SECRET = {"PWD", "OLDPWD", "KEYBOARD"}  # names that only look alike (PWD is the working folder)

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/?#@\s]*):(?P<pw>[^@/\s]*)@")
# A value stops at ? and =, so a URL value's query is scanned too.
_ASSIGN = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<eq>=|%3[Dd])(?P<value>[^\s&;,?='\"<>]*)")


def looks_secret(name: str) -> bool:
    """Whether a variable, option or parameter name looks like it holds a secret."""
    upper = name.strip("-").upper()
    if upper in _NOT_SECRET:
        return False
    return any(part.endswith(word) for part in re.split(r"[^A-Z0-9]+", upper) if part for word in SECRET_WORDS)


def redact_text(text: str) -> str:
    """`text` with URL passwords and the values of secret-looking `name=value` pairs masked."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return _ASSIGN.sub(lambda m: (f"{m['name']}{m['eq']}{MASK}" if m["value"] and looks_secret(m["name"])
                                  else m.group(0)), text)


def redact_args(args: Iterable[str]) -> list[str]:
    """A command line's arguments redacted, including the value that follows `--token` and the like."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        arg = str(arg)
        if hide_next and not arg.startswith("-"):
            out.append(MASK)
        else:
            out.append(redact_text(arg))
        hide_next = arg.startswith("-") and "=" not in arg and looks_secret(arg)
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables: a secret-looking name's value masked, every other value redacted as text."""
    return {k: (MASK if looks_secret(k) and v else redact_text(str(v))) for k, v in env.items()}


def redact(obj: Any) -> Any:
    """A JSON-like document (dicts, lists, strings) redacted throughout: every string as text, and the string
    value of a key that looks like a secret masked whole. Numbers and other values are left as they are."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, Mapping):
        return {k: (MASK if isinstance(v, str) and v and isinstance(k, str) and looks_secret(k) else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v) for v in obj) if isinstance(obj, list) else tuple(redact(v) for v in obj)
    return obj
