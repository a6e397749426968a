"""Privacy redaction: the pattern catalogue and pure functions that apply it. No I/O.

:func:`redact` replaces private network addresses, users' home directories and secrets with typed
placeholders (``[REDACTED-<CLASS>]``) and counts what it replaced, per class. What each class replaces,
what stays, and the known limits: docs/security.md, section "What redaction replaces".

How the rules run: in catalogue order, each on the text produced by the previous rule; values that are
already placeholders are skipped, so redaction is idempotent and each secret is counted once. The rules
see the text with compatibility forms folded (NFKC), invisible characters and combining marks on ASCII
letters dropped, and replace what they find in the text as given. Every regex is linear-time on any
input: unbounded repetitions are possessive (no backtracking into them), others are bounded, and context
that would need a variable-length look-behind is checked in Python on a bounded window. A rule only scans
a text that contains one of its trigger strings. Extra patterns are the caller's regexes: keep them
linear too.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from haystack_osa_memory.errors import ConfigurationError, InvalidInputError

PRIVATE_KEY, JWT, SECRET, PASSWORD, USER_PATH, PRIVATE_IP = (
    "private_key",
    "jwt",
    "secret",
    "password",
    "user_path",
    "private_ip",
)
#: Built-in classes and their placeholders, in the order their rules run.
PLACEHOLDERS: Mapping[str, str] = {
    PRIVATE_KEY: "[REDACTED-PRIVATE-KEY]",
    JWT: "[REDACTED-JWT]",
    SECRET: "[REDACTED-SECRET]",
    PASSWORD: "[REDACTED-PASSWORD]",
    USER_PATH: "[REDACTED-USER-PATH]",
    PRIVATE_IP: "[REDACTED-PRIVATE-IP]",
}
CLASSES: tuple[str, ...] = tuple(PLACEHOLDERS)
#: What a placeholder looks like (built-in and extra): ``[REDACTED-<NAME>]``.
PLACEHOLDER_PATTERN = re.compile(r"\[REDACTED-[A-Z0-9][A-Z0-9_-]{0,40}\]")
#: Names of extra patterns: lower-case identifiers.
EXTRA_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,63}")
EXTRA_PATTERN_KEYS = ("regex", "placeholder")
#: The named group that, when present in a regex, is the only part replaced.
VALUE_GROUP = "value"

Span = tuple[int, int]
Refine = Callable[[re.Match[str]], Span | None]


@dataclass(frozen=True)
class RedactionResult:
    """The redacted text and how many replacements each class made (classes with none are left out)."""

    text: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """All replacements."""
        return sum(self.counts.values())


@dataclass(frozen=True)
class Rule:
    """One pattern of the catalogue.

    ``refine`` turns a match into the span to replace (``None`` keeps the match). Without it the
    span is the ``value`` group when the regex has one, else the whole match. ``triggers`` are
    lower-case strings of which the text must contain one for the rule to run (empty: always runs).
    """

    name: str
    cls: str
    regex: re.Pattern[str]
    placeholder: str
    refine: Refine | None = None
    triggers: tuple[str, ...] = ()

    def span(self, match: re.Match[str]) -> Span | None:
        if self.refine is not None:
            return self.refine(match)
        if VALUE_GROUP in self.regex.groupindex:
            if match.group(VALUE_GROUP) is None:
                return None
            return match.span(VALUE_GROUP)
        return match.span()


# --------------------------------------------------------------------------------------------------
# checks shared by the rules
# --------------------------------------------------------------------------------------------------

_SKIP_WORDS = frozenset(
    {
        "none", "null", "nil", "true", "false", "yes", "no", "on", "off", "undefined", "required",
        "optional", "empty", "redacted", "filtered", "masked", "hidden", "omitted", "removed", "n/a",
        "tbd", "todo", "str", "string", "int", "bytes", "bool", "any", "secretstr", "secretbytes",
        "optional[str]", "str|none", "string|null", "string|undefined",
    }
)  # fmt: skip
_MASK = re.compile(r"[*xX•.#_-]+")
_CODE_REFERENCE = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+"  # attribute access: args.password, settings.X
    r"|[a-z_][a-z0-9_]*_[a-z0-9_]+|[A-Z][A-Z0-9]*_[A-Z0-9_]+"  # a variable or constant name
)
_SECRETISH_NAME = re.compile(r"pass|pwd|secret|token|key|cred|auth", re.IGNORECASE)
_TYPE_WORD = re.compile(r"(?:Optional\[|SecretStr\b|str\b|string\b|bytes\b|Any\b)")
_KEYWORDS = frozenset({"await", "new", "async", "function", "lambda", "yield", "typeof", "require"})
_TRAILING_PUNCT = ".,:;"
_CLOSERS = {")": "(", "]": "[", "}": "{", ">": "<"}
_SYMBOL = re.compile(r"[^A-Za-z0-9_\s]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING_PREFIXES = frozenset({"f", "r", "b", "u", "rb", "br", "fr", "rf"})
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def is_placeholder_value(value: str) -> bool:
    """True for values that are not secrets: empty, masked, references and templates, null words."""
    v = value.strip()
    if not v or v.startswith(("$", "%", "<", "{", "!", "&", "*", "@", "#", "|", ">", "[REDACTED", "(REDACTED", "\\$")):
        return True
    if "..." in v or "\u2026" in v:  # elided: "osam_...", "sk-…"
        return True
    if v.startswith("[") and v.endswith("]") and v[1:-1].strip().lower() in {"redacted", "filtered", "hidden", ""}:
        return True
    return bool(_MASK.fullmatch(v)) or v.lower().replace(" ", "") in _SKIP_WORDS


def _mixed(value: str) -> bool:
    """Random tokens mix lower case, upper case and digits; slugs and words do not."""
    return any(c.islower() for c in value) and any(c.isupper() for c in value) and any(c.isdigit() for c in value)


def _looks_secret(value: str) -> bool:
    """The shape of a secret for weak contexts: at least 6 characters with a digit or a symbol."""
    return len(value) >= 6 and (any(c.isdigit() for c in value) or bool(_SYMBOL.search(value)))


def _is_code_value(value: str, key: str) -> bool:
    """Unquoted values that are code, not literals: calls, indexing, attribute access, secret-ish names."""
    last = re.split(r"[.$]", key)[-1].lstrip("-_")
    if "(" in value or "[" in value or value.lower() in {key.lower(), last.lower()} or value in _KEYWORDS:
        return True
    if _TYPE_WORD.match(value):
        return True
    if _CODE_REFERENCE.fullmatch(value):
        if "." in value:  # attribute access, unless a part is random (hvs.CAESIx...: a Vault token)
            return not any(_mixed(part) for part in value.split("."))
        return bool(_SECRETISH_NAME.search(value))
    return False


def _trim(start: int, value: str) -> Span | None:
    """Drop trailing sentence punctuation and unmatched closing brackets (``{user=a, password=b}``)."""
    v = value
    while v and (v[-1] in _TRAILING_PUNCT or (v[-1] in _CLOSERS and _CLOSERS[v[-1]] not in v)):
        v = v[:-1]
    return (start, start + len(v)) if v else None


def _first_on_line(text: str, pos: int) -> bool:
    """Only blanks and list dashes precede ``pos`` on its line (a YAML key)."""
    i = pos
    while i > 0 and text[i - 1] in " \t-":
        i -= 1
    return i == 0 or text[i - 1] == "\n"


def _rest_of_line(text: str, pos: int) -> str:
    """What follows ``pos`` on its line, without a trailing ``# comment``."""
    end = text.find("\n", pos)
    rest = text[pos : len(text) if end < 0 else end].strip()
    return "" if rest.startswith("#") else rest


def _before(match: re.Match[str], width: int) -> str:
    """Up to ``width`` characters before the match, on its line."""
    text, start = match.string, match.start()
    low = max(0, start - width)
    return text[max(low, text.rfind("\n", low, start) + 1) : start]


#: Joiners of compound names and header fields: a token right after one starts a word of its own.
_NAME_SEPARATORS = frozenset("-_")
#: Words that label a credential: a token glued to one (``tokenxoxb-…``, ``bearereyJ…``) starts a word.
_CREDENTIAL_LABELS = (
    "token", "tokens", "bearer", "key", "keys", "apikey", "secret", "secrets", "password", "passwd", "pwd",
    "pass", "auth", "credential", "credentials", "jwt", "session", "cookie", "authorization", "sig", "signature",
)  # fmt: skip
#: Words that label an address: a private address glued to one (``host10.12.34.56``) is still one.
_ADDRESS_LABELS = (
    "host", "hostname", "ip", "ipv4", "addr", "address", "server", "srv", "gateway", "gw", "dns", "proxy",
    "peer", "node", "db", "from", "to", "at", "via", "remote", "bind", "listen",
)  # fmt: skip
_LABEL_WIDTH = 16


def _glued_to_label(text: str, start: int, labels: tuple[str, ...]) -> bool:
    """The ASCII letters right before ``start`` end with one of ``labels`` (checked on a bounded window)."""
    low = max(0, start - _LABEL_WIDTH)
    i = start
    while i > low and text[i - 1].isascii() and text[i - 1].isalpha():
        i -= 1
    return i < start and text[i:start].lower().endswith(labels)


def _starts_word(text: str, start: int, *, glued: bool = True) -> bool:
    """The token-shaped secret at ``start`` begins a word of its own instead of ending a longer one.

    It may follow: the start of the text, a character tokens are not made of, a separator of compound
    names (``x-AKIA…``, ``key_ghp_…``, ``url-sk_live_…``, ``x-eyJ…``) and, when ``glued`` (the token
    has a literal prefix), a lower-case letter before a token that starts with a capital, as camelCase
    joins words (``awsAKIA…``, ``keyAIza…``), or any letter before one that starts with a digit
    (``bot123456789:AA…``), or a word that labels a credential (``tokenxoxb-…``, ``bearereyJ…``). It
    may not follow a digit or another letter (``1AKIA…``, ``xghp_…``, ``Xghp_…``): that is the tail of
    a longer run, and ordinary words end with some prefixes (``risk-…``, ``Ask-…``, ``task_test_…``,
    ``highs_…``, ``pnpm_…``).
    """
    if start == 0:
        return True
    before, first = text[start - 1], text[start]
    if before not in _TOKEN_CHARS or before in _NAME_SEPARATORS:
        return True
    if not glued or not before.isalpha():
        return False
    if first.isdigit() or (before.islower() and first.isupper()):
        return True
    return _glued_to_label(text, start, _CREDENTIAL_LABELS)


def _token_start(match: re.Match[str], *, glued: bool = True) -> bool:
    """The match begins a word (see :func:`_starts_word`)."""
    return _starts_word(match.string, match.start(), glued=glued)


def _refine_value(match: re.Match[str]) -> Span | None:
    """The ``value`` group unless it is a reference, a mask or a placeholder."""
    value = match.group(VALUE_GROUP)
    if value is None or is_placeholder_value(value):
        return None
    return match.span(VALUE_GROUP)


def _refine_quoted_or_bare(match: re.Match[str]) -> Span | None:
    """The first of the ``dq`` / ``sq`` / ``value`` groups that matched, unless it is a reference."""
    for group in ("dq", "sq", VALUE_GROUP):
        value = match.group(group)
        if value is not None:
            return None if is_placeholder_value(value) else match.span(group)
    return None


# --------------------------------------------------------------------------------------------------
# private keys, JWTs
# --------------------------------------------------------------------------------------------------

_PEM_HEAD = r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
_PEM_TAIL = r"-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
# A complete block: anything but two dashes in a row up to the END line (header lines such as
# "Proc-Type: 4,ENCRYPTED" and JSON "\n" escapes included). A truncated block: its base64 lines.
_PEM = re.compile(
    rf"{_PEM_HEAD}(?:(?:[A-Za-z0-9+/=\s:,.\\]|-(?!-))*+{_PEM_TAIL}"
    rf"|(?:[ \t]*+(?:\\[nr]|\r?\n)[ \t]*+(?:[A-Za-z-]{{2,40}}:[^\n\\]{{0,200}}+|[A-Za-z0-9+/=]{{16,}}+))*+)"
)
# Matched from the start of a run of token characters, so that a run is scanned once (starting at
# every '-' or '_' inside a run would rescan it each time: quadratic); the lazy, bounded head lets the
# JWT sit behind a short glued label (`x-eyJ…`), which the refine checks like any token's left side.
_JWT = re.compile(
    r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{0,64}?"
    r"(?P<value>eyJ[A-Za-z0-9_-]{8,}+\.eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+)"
)


def _refine_jwt(match: re.Match[str]) -> Span | None:
    start = match.start(VALUE_GROUP)
    return match.span(VALUE_GROUP) if _starts_word(match.string, start) else None


# --------------------------------------------------------------------------------------------------
# tokens with a known shape
# --------------------------------------------------------------------------------------------------


def _token(body: str, flags: int = 0) -> re.Pattern[str]:
    """A token regex: starts with its prefix (fast to search); the refine checks what precedes it."""
    return re.compile(f"(?:{body})(?![A-Za-z0-9_-])", flags)


def _refine_token(match: re.Match[str]) -> Span | None:
    if not _token_start(match):
        return None
    return _refine_value(match) if VALUE_GROUP in match.re.groupindex else match.span()


def _refine_mixed(match: re.Match[str]) -> Span | None:
    """``sk-`` and ``hf_`` tokens: only when the random part mixes cases and digits (not a slug)."""
    body = match.group(VALUE_GROUP)
    random_looking = _mixed(body) or (match.group(0).startswith("hf_") and not body.islower())
    return match.span() if random_looking and _token_start(match) else None


def _refine_telegram(match: re.Match[str]) -> Span | None:
    """Also not after ':' (the tail of a longer colon-separated id); after letters: ``bot<token>`` in URLs."""
    start = match.start()
    return match.span() if (start == 0 or match.string[start - 1] != ":") and _token_start(match) else None


def _refine_shape_token(match: re.Match[str]) -> Span | None:
    """Tokens known by shape alone (no literal prefix): never glued to a letter, where identifiers are."""
    return match.span() if _token_start(match, glued=False) else None


# (name, regex, refine, triggers)
_TOKEN_RULES: tuple[tuple[str, re.Pattern[str], Refine, tuple[str, ...]], ...] = (
    (
        "aws_access_key_id",
        re.compile(r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
        _refine_token,
        ("akia", "asia", "abia", "acca"),
    ),
    (
        "github_token",
        _token(r"gh[pousr]_[A-Za-z0-9]{36,251}+|github_pat_[A-Za-z0-9_]{22,251}+"),
        _refine_token,
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    (
        "gitlab_token",
        _token(r"gl(?:pat|dt|rt|ptt|oas|cbt|ft|imt|soat|ffct|agent)-[A-Za-z0-9_-]{20,300}+(?:\.[A-Za-z0-9_-]++)*+"),
        _refine_token,
        ("glpat-", "gldt-", "glrt-", "glptt-", "gloas-", "glcbt-", "glft-", "glimt-", "glsoat-", "glffct-", "glagent-"),
    ),
    (
        "slack_token",
        _token(r"xox[abposre]-[A-Za-z0-9-]{10,250}+|xapp-[0-9]-[A-Za-z0-9-]{10,250}+"),
        _refine_token,
        ("xox", "xapp-"),
    ),
    (
        "slack_webhook",
        re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<value>[A-Za-z0-9_/-]{10,300}+)"),
        _refine_value,
        ("hooks.slack.com/",),
    ),
    (
        "discord_token",
        _token(r"[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,40}"),
        _refine_shape_token,
        (),
    ),
    (
        "discord_webhook",
        re.compile(r"discord(?:app)?\.com/api/webhooks/[0-9]{5,25}/(?P<value>[A-Za-z0-9_-]{20,200}+)"),
        _refine_value,
        ("/api/webhooks/",),
    ),
    (
        "stripe_key",
        _token(r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,247}+|whsec_[A-Za-z0-9+/=]{24,100}+"),
        _refine_token,
        ("sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_"),
    ),
    (
        "openai_style_key",
        _token(r"sk-(?:proj-|svcacct-|admin-|ant-(?:api|admin|sid)[0-9]{2}-)?(?P<value>[A-Za-z0-9_-]{20,250}+)"),
        _refine_mixed,
        ("sk-",),
    ),
    (
        "telegram_bot_token",
        _token(r"[0-9]{8,10}:AA[A-Za-z0-9_-]{33}"),
        _refine_telegram,
        (":aa",),
    ),
    ("google_api_key", _token(r"AIza[A-Za-z0-9_-]{35}"), _refine_token, ("aiza",)),
    ("google_oauth_token", _token(r"ya29\.[A-Za-z0-9_-]{20,2000}+"), _refine_token, ("ya29.",)),
    ("npm_token", _token(r"npm_[A-Za-z0-9]{36}"), _refine_token, ("npm_",)),
    ("pypi_token", _token(r"pypi-AgE[A-Za-z0-9_-]{50,500}+"), _refine_token, ("pypi-age",)),
    ("huggingface_token", _token(r"hf_(?P<value>[A-Za-z0-9]{30,40}+)"), _refine_mixed, ("hf_",)),
    ("sendgrid_key", _token(r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"), _refine_token, ("sg.",)),
    ("dockerhub_token", _token(r"dckr_pat_[A-Za-z0-9_-]{20,100}+"), _refine_token, ("dckr_pat_",)),
    ("osa_memory_token", _token(r"osam_[0-9a-f]{16}_[A-Za-z0-9_-]{43}"), _refine_token, ("osam_",)),
    (
        "azure_connection_key",
        re.compile(
            r"(?<![A-Za-z0-9])(?:AccountKey|SharedAccessKey|SharedAccessSignature|ClientSecret)="
            r"(?P<value>[^;\"'\s<>]{8,1000}+)",
            re.IGNORECASE,
        ),
        _refine_value,
        ("accountkey=", "sharedaccesskey=", "sharedaccesssignature=", "clientsecret="),
    ),
    (
        "azure_sas_signature",
        re.compile(r"[?&;]sig=(?P<value>[A-Za-z0-9%+/=_-]{16,300}+)"),
        _refine_value,
        ("sig=",),
    ),
)


# --------------------------------------------------------------------------------------------------
# passwords in URLs and command lines, authorization headers
# --------------------------------------------------------------------------------------------------

_URL_USERINFO = re.compile(
    # scheme://user:password@  (the password may contain '@': the last '@' before the host wins)
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{1,30}+://[^\s:/?#@\"'<>]{0,128}+:"
    r"(?P<value>[^\s/?#\"'<>]{1,256})@(?=[A-Za-z0-9\[_-])"
)
# The same in a URL-encoded (``postgresql%3A%2F%2Fadmin%3As3cret%40db``, also encoded twice: ``%253A``)
# or JSON-escaped (``postgresql:\/\/admin:s3cret@db``) connection string; an encoded ':' or '@' is enough.
_ENC_COLON = r"(?::|%(?:25)?3[Aa])"
_ENC_AT = r"(?:@|%(?:25)?40)"
_ENC_SLASH = r"(?:/|\\/|%(?:25)?2[Ff])"
_ENC_CHAR = r"%(?!(?:25)?(?:3[Aa]|40|2[Ff]|3[Ff]|23))(?:25)?[0-9A-Fa-f]{2}"  # not an encoded : @ / ? #
_URL_USERINFO_ENCODED = re.compile(
    rf"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{{1,30}}+{_ENC_COLON}{_ENC_SLASH}{_ENC_SLASH}"
    rf"(?:[^\s:/?#@%\"'<>&\\]|{_ENC_CHAR}){{0,128}}+{_ENC_COLON}"
    rf"(?P<value>(?:[^\s/?#@%\"'<>&\\]|{_ENC_CHAR}){{1,256}}){_ENC_AT}(?=[A-Za-z0-9\[_-])"
)


def _refine_encoded_url(match: re.Match[str]) -> Span | None:
    """Only encoded or escaped forms: the plain one is ``url_password``'s."""
    whole = match.group(0)
    return _refine_value(match) if "%" in whole or "\\/" in whole else None


_CURL_USER = re.compile(r"(?:-u|--user)[ =][\"']?[^\s:\"']{1,64}+:(?P<value>[^\s\"']{1,256}+)")
_CURL_CONTEXT = re.compile(r"(?<![A-Za-z0-9_-])curl\s")
# -p after mysql/mariadb (-pSECRET), sshpass (-p SECRET) and docker/az login (-p SECRET)
_DASH_P = re.compile(
    r"-p(?P<space>[ \t]*+)(?:\"(?P<dq>[^\"\n]{1,256}+)\"|'(?P<sq>[^'\n]{1,256}+)'|(?P<value>[^\s\"'-][^\s\"']{0,255}+))"
)
_MYSQL_CONTEXT = re.compile(r"(?<![A-Za-z0-9_-])(?:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump)\s")
_LOGIN_CONTEXT = re.compile(r"(?<![A-Za-z0-9_-])(?:docker|az)[ \t]+login\s")
_SSHPASS_CONTEXT = re.compile(r"(?<![A-Za-z0-9_-])sshpass[ \t]+\Z")
_CONTEXT_WIDTH = 200


def _refine_curl(match: re.Match[str]) -> Span | None:
    before = _before(match, _CONTEXT_WIDTH)
    if not before or before[-1] not in " \t" or not _CURL_CONTEXT.search(before):
        return None  # `docker run -u 1000:1000` is a uid, not a password
    return _refine_value(match)


def _refine_dash_p(match: re.Match[str]) -> Span | None:
    before = _before(match, _CONTEXT_WIDTH)
    if not before or before[-1] not in " \t":
        return None
    if _SSHPASS_CONTEXT.search(before[-16:]):
        return _refine_quoted_or_bare(match)
    bare = not match.group("space") and match.group(VALUE_GROUP) is not None
    if (bare and _MYSQL_CONTEXT.search(before)) or (match.group("space") and _LOGIN_CONTEXT.search(before)):
        return _refine_quoted_or_bare(match)
    return None


_NETRC = re.compile(
    r"(?<![A-Za-z0-9_-])machine[ \t]+\S{1,255}+\s++(?:login[ \t]+\S{1,255}+\s++)?password[ \t]+(?P<value>\S{1,255}+)"
)
_AWS_CONFIGURE = re.compile(
    r"(?<![A-Za-z0-9_-])aws[ \t]+configure[ \t]+set[ \t]+(?:[A-Za-z0-9_-]+\.)?aws_(?:secret_access_key|session_token)"
    r"[ \t]+[\"']?(?P<value>[^\s\"']{1,2000}+)"
)
_AUTHORIZATION = re.compile(
    r"(?<![A-Za-z0-9_-])(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?(?:bearer|basic|token|bot|apikey)[ \t]+"
    r"(?P<value>[A-Za-z0-9._~+/-]{6,4000}+=*+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?<![A-Za-z0-9_-])[Bb]earer[ \t]+(?P<value>[A-Za-z0-9._~+/-]{16,4000}+=*+)")


def _refine_bearer(match: re.Match[str]) -> Span | None:
    """A bare ``Bearer x``: the credential must look random (letters and digits), prose stays."""
    value = match.group(VALUE_GROUP)
    if is_placeholder_value(value) or not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return None
    return match.span(VALUE_GROUP)


# --------------------------------------------------------------------------------------------------
# key = value assignments (env, INI, TOML, YAML, JSON, code, XML, command-line flags)
# --------------------------------------------------------------------------------------------------

_PASSWORDISH_KEYS = r"password|passwd|passphrase|pass|pwd"
_SECRETISH_KEYS = (
    r"secret[_-]?key[_-]?base|secret[_-]?key|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|"
    r"credentials?|signing[_-]?key|encryption[_-]?key|master[_-]?key|app[_-]?key|auth[_-]?key"
)
_PASSWORD_TRIGGERS = ("pass", "pwd", "identified")
_SECRET_TRIGGERS = ("secret", "token", "key", "credential")
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.$-")
_KEY_MAX = 64
_SEP = r"(?P<sep>[ \t]{0,4}(?:=>|:=|=(?!=)|:(?![:/\\]))[ \t]{0,4})"
_VALUE = (
    r"(?:\"(?P<dq>(?:[^\"\\\n]|\\.){0,512}+)\""
    r"|'(?P<sq>(?:[^'\\\n]|\\.){0,512}+)'"
    r"|(?P<uq>(?:[^\s\"'`&;]|&(?![A-Za-z0-9_.-]{1,64}+=)){1,512}+))"
)


def _assignment(words: str, *, space_sep: bool) -> re.Pattern[str]:
    """``<key ending with a word><quote?><separator><value>``; the refine finds where the key starts.

    The regex starts at the word (fast to search); the rest of the key is read backwards.
    """
    sep = _SEP
    if space_sep:  # SQL PASSWORD 'x', IDENTIFIED BY 'x', "password hunter2" (a secret-looking value only)
        sep = rf"(?:{_SEP}|[ \t]+)"
    return re.compile(rf"(?:{words})(?P<q>[\"']?){sep}{_VALUE}", re.IGNORECASE | re.MULTILINE)


def _key_start(text: str, word_start: int) -> int | None:
    """Where the key that ends with the word at ``word_start`` begins; ``None`` when it is too long."""
    i, low = word_start, max(0, word_start - _KEY_MAX)
    while i > low and text[i - 1] in _KEY_CHARS:
        i -= 1
    if i == low and i > 0 and text[i - 1] in _KEY_CHARS:
        return None
    return i


def _short_word_ok(key: str) -> bool:
    """``pass`` and ``pwd`` only as their own word: ``db_pass``, ``dbPass``, ``MYSQL_PWD``; not ``bypass``."""
    lower = key.lower()
    for word in ("pass", "pwd"):
        if lower.endswith(word) and not lower.endswith(("password", "passwd")):
            head = key[: -len(word)]
            if not head.lstrip("-$"):
                return word == "pass"  # bare "pass" is a key; bare "PWD" is the working directory
            return head[-1] in "_.-" or (head[-1].islower() and key[-len(word)].isupper())
    return True


def _has_digit(value: str) -> bool:
    return any(c.isdigit() for c in value)


_SPACE_SEPARATED_KEY = re.compile(r"(?:password|passwd|passphrase|identified[ \t]+by)\Z", re.IGNORECASE)


def _refine_assignment(match: re.Match[str], *, spaces_allowed: bool = True) -> Span | None:
    """Decide whether the value of a ``key <sep> value`` match is a literal secret.

    Quoted values are literals (unless templates or placeholders). Unquoted values are skipped when
    they are code (calls, attribute access, variables named like secrets, type names, a variable in
    ``x = y`` or in a dict literal), counts, or too short; in weak contexts (``key: value`` inside a
    sentence, ``password value`` without a separator, the bare word ``pass``) they must look like a
    secret.
    """
    text = match.string
    start = _key_start(text, match.start())
    if start is None:
        return None
    word_end = match.start("q") if match.group("q") is not None else match.start("sep")
    key = text[start:word_end]
    quote = match.group("q") or ""
    if quote and (start == 0 or text[start - 1] != quote):
        return None  # "password": needs its opening quote
    if not _short_word_ok(key):
        return None
    sep = match.group("sep")
    if sep is None and not _SPACE_SEPARATED_KEY.search(key):
        return None  # only SQL/.netrc-like "password <value>"; never "pass 'ignore'" or "token v"
    weak_key = key.lower().lstrip("-$_") == "pass" or sep is None  # the verb "pass", prose
    for group in ("dq", "sq"):
        value = match.group(group)
        if value is not None:
            if is_placeholder_value(value) or (value.startswith("{") and value.endswith("}")):
                return None
            if not spaces_allowed and any(c.isspace() for c in value):
                return None  # OPENAI_API_KEY="My API Key": tokens have no spaces (passphrases do)
            if key.lower().lstrip("-$_") == "pass" and not _has_digit(value):
                return None  # {'pass': 'The "pass" statement'}
            return match.span(group)
    value = match.group("uq")
    if value is None or is_placeholder_value(value):
        return None
    span = _trim(match.start("uq"), value)
    if span is None:
        return None
    value = text[span[0] : span[1]]
    if is_placeholder_value(value) or _is_code_value(value, key) or len(value) < 4:
        return None  # code, a count ({'password': 1}), a word too short to be a password
    if value.lower() in _STRING_PREFIXES and text[span[1] : span[1] + 1] in ("'", '"'):
        return None  # a string prefix: token=f"{prefix}_{secret}"
    if quote and _IDENTIFIER.fullmatch(value):
        return None  # {"OSA_MEMORY_TOKEN": token}: a variable in a dict literal
    if weak_key and not (_looks_secret(value) and _has_digit(value)):
        return None  # "password and/or", "pass next_cursor back"
    spaced = sep is not None and sep[:1] in " \t" and sep[-1:] in " \t" and sep.strip() in ("=", ":=")
    if spaced and _IDENTIFIER.fullmatch(value) and not _has_digit(value):
        return None  # code: self.token = nextchar, user, password = credentials
    # "key: value" is trusted on a YAML line (key first, value last on its line); inside a sentence or
    # a log line ("invalid token: expired") the value must look like a secret.
    colon = sep is not None and sep.strip() == ":" and not quote
    yaml_line = _first_on_line(text, start) and not _rest_of_line(text, span[1])
    if colon and not yaml_line and not _looks_secret(value):
        return None
    return span


_YAML_PASSWORD_LINE = re.compile(
    rf"^[ \t]*+(?:-[ \t]+)?(?P<q>[\"']?)(?P<key>[A-Za-z0-9_.$-]{{0,64}}?(?:{_PASSWORDISH_KEYS}))(?P=q)[ \t]*:[ \t]+"
    r"(?P<value>[^\s\"'][^\n]{0,511})",
    re.IGNORECASE | re.MULTILINE,
)
_PROSE_WORDS = frozenset(
    {
        "a", "an", "the", "in", "at", "on", "is", "are", "was", "see", "ask", "from", "for", "to", "of",
        "with", "stored", "use", "used", "via", "please", "not", "our", "your", "check", "same", "as",
        "and", "or", "it", "its", "be", "will", "by", "set", "sent", "shared", "rotated", "until", "all",
        "updated", "changed", "successfully", "failed", "expired", "invalid", "missing", "required",
        "must", "should", "can", "cannot", "has", "have", "been", "this", "that", "here", "there", "now",
    }
)  # fmt: skip


def _refine_secret_assignment(match: re.Match[str]) -> Span | None:
    return _refine_assignment(match, spaces_allowed=False)


def _refine_yaml_password(match: re.Match[str]) -> Span | None:
    """``password: several words`` on its own YAML line: the whole value, unless it reads like prose."""
    key = match.group("key")
    raw = match.group(VALUE_GROUP)
    cut = raw.find(" #")
    raw = (raw if cut < 0 else raw[:cut]).rstrip()
    words = raw.split()
    if len(words) < 2 or not _short_word_ok(key):
        return None  # one word: the assignment rule decides
    first = words[0]
    if is_placeholder_value(first) or _is_code_value(first, key) or "(" in raw or "=" in raw:
        return None
    start = match.start(VALUE_GROUP)
    if any(w.lower().strip(".,;:!?()") in _PROSE_WORDS for w in words):
        # "Password: stored in Vault at secret/db" stays; "Password: hunter2 is the new one" loses hunter2.
        return _trim(start, first) if _looks_secret(first) else None
    return _trim(start, raw)


_CLI_FLAG = (
    r"(?<![A-Za-z0-9_-])--(?:[A-Za-z0-9]++-){{0,4}}(?:{words})[ =]"
    r"(?:\"(?P<dq>[^\"\n]{{1,256}}+)\"|'(?P<sq>[^'\n]{{1,256}}+)'|(?P<value>[^\s\"'-][^\s\"']{{0,255}}+))"
)


def _xml(words: str) -> re.Pattern[str]:
    return re.compile(
        rf"<(?P<tag>[A-Za-z0-9_.:-]{{0,40}}?(?:{words}))>(?P<value>[^<\n]{{1,512}}+)</(?P=tag)>", re.IGNORECASE
    )


# --------------------------------------------------------------------------------------------------
# home directories
# --------------------------------------------------------------------------------------------------

_USER = r"[\w-](?:[\w$-]|\.(?=[\w-])){0,63}+"  # a user name; a trailing dot ends the sentence
_WIN_SEG = r"[\w$-](?:[\w$-]|\.(?=[\w$-])){0,63}+"
_WIN_USER = rf"(?:{_WIN_SEG}(?: {_WIN_SEG}){{1,3}}(?=\\|/)|{_WIN_SEG})"
_NOT_PATH_BEFORE = r"(?<![\w.~%$-])"
_SHARED_WIN = r"(?:Public|Default|Default User|All Users|defaultuser0)"
_LINUX_HOME = re.compile(rf"{_NOT_PATH_BEFORE}(?:/var|/usr)?/home/{_USER}(?![\w$-])")
_MAC_HOME = re.compile(rf"{_NOT_PATH_BEFORE}/Users/(?!(?:Shared|Guest)(?![\w-])){_USER}(?![\w$-])")
_WIN_HOME = re.compile(
    rf"(?<![\w.-])[A-Za-z]:(?:\\{{1,2}}|/)(?i:users|documents and settings)(?:\\{{1,2}}|/)"
    rf"(?!(?i:{_SHARED_WIN})(?![\w$. -]))(?!%){_WIN_USER}"
)
_POSIX_WIN_HOME = re.compile(
    rf"{_NOT_PATH_BEFORE}(?:/mnt/[A-Za-z]|/cygdrive/[A-Za-z]|/[A-Za-z])/Users/"
    rf"(?!(?i:{_SHARED_WIN})(?![\w$. -])){_WIN_USER}"
)


# --------------------------------------------------------------------------------------------------
# private addresses
# --------------------------------------------------------------------------------------------------

_PRIVATE_V4 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_PRIVATE_V6 = tuple(ipaddress.IPv6Network(n) for n in ("fc00::/7", "fe80::/10"))
_RFC_RANGES = frozenset(
    {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fe80::/10", "fd00::/8"}
)  # fmt: skip
# Starts with a digit (fast to search); what precedes it is checked by the refine.
_IPV4 = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?![A-Za-z0-9_]|\.[0-9])")
_NOT_IPV4_BEFORE = re.compile(
    r"(?:[A-Za-z0-9_.]|[=~<>!]=|version ?[=:]? ?|version\" ?: ?\"|version ?= ?\")\Z", re.IGNORECASE
)
_AWS_HOST = re.compile(r"(?<![A-Za-z0-9_.-])ip-(?P<value>[0-9]{1,3}-[0-9]{1,3}-[0-9]{1,3}-[0-9]{1,3})(?![0-9])")
_IPV6 = re.compile(
    r"(?P<value>[Ff](?:[CcDd][0-9A-Fa-f]{2}|[Ee][89AaBb][0-9A-Fa-f])(?::[0-9A-Fa-f]{0,4}+){1,7}+)"
    r"(?P<zone>%[A-Za-z0-9_.-]{1,32}+)?(?![0-9A-Za-z_])"
)


def _is_rfc_range(text: str, end: int, address: str) -> bool:
    slash = re.match(r"/[0-9]{1,3}(?![0-9])", text[end : end + 4])
    return slash is not None and f"{address}{slash.group(0)}".lower() in _RFC_RANGES


def _private_v4(octets: list[str]) -> bool:
    if any(int(o) > 255 for o in octets):
        return False
    address = ipaddress.IPv4Address(".".join(str(int(o)) for o in octets))
    return any(address in net for net in _PRIVATE_V4)


def _refine_ipv4(match: re.Match[str]) -> Span | None:
    text, value = match.string, match.group(0)
    start = match.start()
    labelled = start > 0 and text[start - 1].isalpha() and _glued_to_label(text, start, _ADDRESS_LABELS)
    if not labelled and _NOT_IPV4_BEFORE.search(text[max(0, start - 12) : start]):
        return None  # inside a longer number, or a version (v10.1.0.2, ==10.1.0.2, "version": "10.1.0.2")
    if not _private_v4(value.split(".")) or _is_rfc_range(text, match.end(), value):
        return None
    return match.span()


def _refine_aws_host(match: re.Match[str]) -> Span | None:
    return match.span() if _private_v4(match.group(VALUE_GROUP).split("-")) else None


def _refine_ipv6(match: re.Match[str]) -> Span | None:
    text = match.string
    if match.start() > 0 and text[match.start() - 1] in "0123456789abcdefABCDEF:.":
        return None  # inside a longer address (2001:fd00::1)
    value = match.group(VALUE_GROUP)
    start, end = match.span(VALUE_GROUP)
    if value.endswith(":") and not value.endswith("::"):  # "fe80::1:" ends a sentence
        value, end = value[:-1], end - 1
    try:
        address = ipaddress.IPv6Address(value)
    except ValueError:
        return None
    whole = end == match.end(VALUE_GROUP)
    if not any(address in net for net in _PRIVATE_V6) or (whole and _is_rfc_range(text, end, value)):
        return None
    zone = match.group("zone")
    if zone is not None and whole:
        end = match.end("zone") - (len(zone) - len(zone.rstrip(".")))
    return start, end


# --------------------------------------------------------------------------------------------------
# the catalogue
# --------------------------------------------------------------------------------------------------


def _builtin_rules() -> tuple[Rule, ...]:
    ph = PLACEHOLDERS
    rules: list[Rule] = [
        Rule("pem_private_key", PRIVATE_KEY, _PEM, ph[PRIVATE_KEY], triggers=("-----begin",)),
        Rule("jwt", JWT, _JWT, ph[JWT], _refine_jwt, triggers=("eyj",)),
    ]
    rules += [Rule(name, SECRET, rx, ph[SECRET], refine, trig) for name, rx, refine, trig in _TOKEN_RULES]
    password_flag = re.compile(_CLI_FLAG.format(words=r"password|passwd|passphrase|pass"), re.IGNORECASE)
    secret_flag = re.compile(
        _CLI_FLAG.format(words=r"token|secret|api-key|apikey|access-key|secret-key|client-secret"), re.IGNORECASE
    )
    rules += [
        Rule("url_password", PASSWORD, _URL_USERINFO, ph[PASSWORD], _refine_value, ("://",)),
        Rule(
            "encoded_url_password",
            PASSWORD,
            _URL_USERINFO_ENCODED,
            ph[PASSWORD],
            _refine_encoded_url,
            ("%3a", "%253a", ":\\/\\/"),
        ),
        Rule("curl_user_password", PASSWORD, _CURL_USER, ph[PASSWORD], _refine_curl, ("curl",)),
        Rule("command_password", PASSWORD, _DASH_P, ph[PASSWORD], _refine_dash_p, ("-p",)),
        Rule("netrc_password", PASSWORD, _NETRC, ph[PASSWORD], _refine_value, ("machine",)),
        Rule("aws_configure_secret", SECRET, _AWS_CONFIGURE, ph[SECRET], _refine_value, ("configure",)),
        Rule("authorization_header", SECRET, _AUTHORIZATION, ph[SECRET], _refine_value, ("authorization",)),
        Rule("bearer_token", SECRET, _BEARER, ph[SECRET], _refine_bearer, ("bearer",)),
        Rule("password_flag", PASSWORD, password_flag, ph[PASSWORD], _refine_quoted_or_bare, ("--",)),
        Rule("secret_flag", SECRET, secret_flag, ph[SECRET], _refine_quoted_or_bare, ("--",)),
        Rule("password_xml", PASSWORD, _xml(_PASSWORDISH_KEYS), ph[PASSWORD], _refine_value, _PASSWORD_TRIGGERS),
        Rule("secret_xml", SECRET, _xml(_SECRETISH_KEYS), ph[SECRET], _refine_value, _SECRET_TRIGGERS),
        Rule(
            "password_yaml_line",
            PASSWORD,
            _YAML_PASSWORD_LINE,
            ph[PASSWORD],
            _refine_yaml_password,
            _PASSWORD_TRIGGERS,
        ),
        Rule(
            "password_assignment",
            PASSWORD,
            _assignment(rf"{_PASSWORDISH_KEYS}|identified[ \t]+by", space_sep=True),
            ph[PASSWORD],
            _refine_assignment,
            _PASSWORD_TRIGGERS,
        ),
        Rule(
            "secret_assignment",
            SECRET,
            _assignment(_SECRETISH_KEYS, space_sep=False),
            ph[SECRET],
            _refine_secret_assignment,
            _SECRET_TRIGGERS,
        ),
        Rule("windows_home", USER_PATH, _WIN_HOME, ph[USER_PATH], triggers=(":\\", ":/")),
        Rule("posix_windows_home", USER_PATH, _POSIX_WIN_HOME, ph[USER_PATH], triggers=("/users/",)),
        Rule("linux_home", USER_PATH, _LINUX_HOME, ph[USER_PATH], triggers=("/home/",)),
        Rule("macos_home", USER_PATH, _MAC_HOME, ph[USER_PATH], triggers=("/users/",)),
        Rule("ipv4", PRIVATE_IP, _IPV4, ph[PRIVATE_IP], _refine_ipv4, (".",)),
        Rule("aws_private_hostname", PRIVATE_IP, _AWS_HOST, ph[PRIVATE_IP], _refine_aws_host, ("ip-",)),
        Rule("ipv6", PRIVATE_IP, _IPV6, ph[PRIVATE_IP], _refine_ipv6, (":",)),
    ]
    return tuple(rules)


#: Every built-in rule, in the order they run.
BUILTIN_RULES: tuple[Rule, ...] = _builtin_rules()


# --------------------------------------------------------------------------------------------------
# look-alike and invisible characters
# --------------------------------------------------------------------------------------------------

# Code points that draw nothing and may be slipped inside a secret (``AKIA\u200b…``): every format
# character (Cf: zero-width space and joiners, word joiner, BOM, soft hyphen, bidi controls, tags) and the
# other default-ignorable ones: combining grapheme joiner, Hangul fillers, variation selectors.
_IGNORABLE_EXTRA = frozenset(
    (0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0, *range(0x180B, 0x1810), *range(0xFE00, 0xFE10))
) | frozenset(range(0xE0100, 0xE01F0))
# The 256-code-point blocks that hold a compatibility form of an ASCII character (NFKC): fullwidth forms,
# mathematical alphanumerics, circled, superscript and subscript letters and digits, modifier letters
# (a unit test checks every code point, so a newer Unicode adding one elsewhere is noticed).
_FOLD_BLOCKS = (
    *(0x00, 0x01, 0x02, 0x03, 0x1D, 0x1F, 0x20, 0x21, 0x24, 0x2C, 0x30, 0xA7, 0xFB, 0xFE, 0xFF),
    *(0x107, 0x1D4, 0x1D5, 0x1D6, 0x1D7, 0x1F1, 0x1FB),
)
#: Combining diacritical marks (basic, extended, supplement, for symbols, half marks).
_COMBINING = "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"


@functools.cache
def _fold_table() -> dict[int, str]:
    """Code point -> its ASCII compatibility form (U+FF21 and U+1D400 -> ``A``, U+00B2 -> ``2``), or ``""``
    for a character that draws nothing. Forms of several characters (``⑴`` -> ``(1)``, ``㎒`` -> ``MHz``)
    are left as they are. Built on first use."""
    table: dict[int, str] = {}
    for block in _FOLD_BLOCKS:
        for cp in range(max(block << 8, 0x80), (block + 1) << 8):
            folded = unicodedata.normalize("NFKC", chr(cp))
            if len(folded) == 1 and folded.isascii():
                table[cp] = folded
    for cp in itertools.chain(range(0x80, 0x20000), range(0xE0000, 0xE1000)):  # where Cf is assigned
        if cp in _IGNORABLE_EXTRA or unicodedata.category(chr(cp)) == "Cf":
            table[cp] = ""
    return table


@functools.cache
def _foldable() -> re.Pattern[str]:
    """Any character :func:`_fold` changes, or a combining mark (dropped after an ASCII character)."""
    runs: list[list[int]] = []
    for cp in sorted(_fold_table()):
        if runs and cp == runs[-1][1] + 1:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp])
    # As ranges: a character class of single characters is scanned one by one, a range at once.
    chars = "".join(f"{re.escape(chr(low))}-{re.escape(chr(high))}" for low, high in runs)
    return re.compile(f"[{chars}{_COMBINING}]")


def _fold(text: str) -> tuple[str, list[int]] | None:
    """The text the rules should see when ``text`` hides ASCII behind look-alike or invisible characters,
    with the index in ``text`` of each of its characters; ``None`` when there is nothing to fold.

    Compatibility forms become their ASCII character (U+FF21 -> ``A``), characters that draw
    nothing are dropped, and so are combining marks on an ASCII character (``A\\u0301KIA``).
    """
    if text.isascii() or _foldable().search(text) is None:
        return None
    table = _fold_table()
    out: list[str] = []
    origin: list[int] = []
    for i, char in enumerate(text):
        folded = table.get(ord(char), char)
        if folded and not folded.isascii() and out and out[-1].isascii() and unicodedata.category(char)[0] == "M":
            folded = ""
        if folded:
            out.append(folded)
            origin.append(i)
    folded_text = "".join(out)
    return None if folded_text == text else (folded_text, origin)


# --------------------------------------------------------------------------------------------------
# policies
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedactionPolicy:
    """A validated, compiled set of rules. Build it with :func:`compile_policy`."""

    rules: tuple[Rule, ...]

    @property
    def classes(self) -> tuple[str, ...]:
        """The classes this policy can report, in rule order."""
        return tuple(dict.fromkeys(rule.cls for rule in self.rules))

    def redact(self, text: str) -> RedactionResult:
        """Apply every rule in order; see :func:`redact`.

        A text that hides ASCII behind look-alike or invisible characters is matched in its folded form
        (:func:`_fold`), and the spans found there are replaced in the text as given: everything else,
        fullwidth or invisible characters included, is kept as it was.
        """
        folded = _fold(text)
        if folded is None:
            return self._redact(text)
        base, origin = folded
        spans, counts = self._spans(base)
        parts: list[str] = []
        pos = 0
        for start, end, placeholder in spans:
            first, last = origin[start], origin[end - 1] + 1
            parts += (text[pos:first], placeholder)
            pos = last
        parts.append(text[pos:])
        return RedactionResult(text="".join(parts), counts=counts)

    def _redact(self, text: str) -> RedactionResult:
        counts: dict[str, int] = {}
        lower = text.lower()
        for rule in self.rules:
            if rule.triggers and not any(t in lower for t in rule.triggers):
                continue
            spans = _spans(rule, text)
            if spans:
                text = _replace(text, spans, rule.placeholder)
                counts[rule.cls] = counts.get(rule.cls, 0) + len(spans)
                lower = text.lower()
        return RedactionResult(text=text, counts=counts)

    def _spans(self, base: str) -> tuple[list[tuple[int, int, str]], dict[str, int]]:
        """What :meth:`_redact` would replace in ``base``, as ``(start, end, placeholder)`` spans of ``base``.

        Each character of the text the rules see carries the span of ``base`` it stands for and the
        replacement it belongs to (-1: none), so spans found after earlier replacements map back.
        """
        counts: dict[str, int] = {}
        text = base
        starts, ends, owners = list(range(len(base))), list(range(1, len(base) + 1)), [-1] * len(base)
        made: list[tuple[int, int, str]] = []
        lower = text.lower()
        for rule in self.rules:
            if rule.triggers and not any(t in lower for t in rule.triggers):
                continue
            spans = _spans(rule, text)
            if not spans:
                continue
            new_starts: list[int] = []
            new_ends: list[int] = []
            new_owners: list[int] = []
            pos = 0
            for start, end in spans:
                new_starts += starts[pos:start]
                new_ends += ends[pos:start]
                new_owners += owners[pos:start]
                made.append((starts[start], ends[end - 1], rule.placeholder))
                size = len(rule.placeholder)
                new_starts += [starts[start]] * size
                new_ends += [ends[end - 1]] * size
                new_owners += [len(made) - 1] * size
                pos = end
            new_starts += starts[pos:]
            new_ends += ends[pos:]
            new_owners += owners[pos:]
            text = _replace(text, spans, rule.placeholder)
            starts, ends, owners = new_starts, new_ends, new_owners
            counts[rule.cls] = counts.get(rule.cls, 0) + len(spans)
            lower = text.lower()
        # The replacements still in the final text, merged where a later one overlapped an earlier one.
        final: list[tuple[int, int, str]] = []
        for owner in dict.fromkeys(o for o in owners if o >= 0):
            start, end, placeholder = made[owner]
            if final and start < final[-1][1]:
                previous = final.pop()
                start, end, placeholder = previous[0], max(end, previous[1]), previous[2]
            final.append((start, end, placeholder))
        return final, counts


def _spans(rule: Rule, text: str) -> list[Span]:
    """The non-overlapping spans of ``text`` that ``rule`` replaces, in order."""
    spans: list[Span] = []
    pos = 0
    for match in rule.regex.finditer(text):
        span = rule.span(match)
        if span is None:
            continue
        start, end = span
        if start < pos or end <= start:
            continue
        spans.append(span)
        pos = end
    return spans


def _replace(text: str, spans: list[Span], placeholder: str) -> str:
    parts: list[str] = []
    pos = 0
    for start, end in spans:
        parts += (text[pos:start], placeholder)
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


def _check_enabled(enabled_classes: Sequence[str] | None) -> tuple[str, ...]:
    if enabled_classes is None:
        return CLASSES
    if isinstance(enabled_classes, str) or not all(isinstance(c, str) for c in enabled_classes):
        msg = f"enabled_classes must be a list of class names from {list(CLASSES)}, got {enabled_classes!r}"
        raise ConfigurationError(msg)
    unknown = [c for c in enabled_classes if c not in PLACEHOLDERS]
    if unknown:
        msg = f"Unknown redaction class(es) {unknown}. Supported classes are: {list(CLASSES)}"
        raise ConfigurationError(msg)
    return tuple(c for c in CLASSES if c in enabled_classes)


def _check_extra(name: object, spec: object) -> Rule:
    if not isinstance(name, str) or not EXTRA_NAME_PATTERN.fullmatch(name):
        msg = f"extra pattern name {name!r} is not allowed: use 1 to 64 of a-z, 0-9 and '_', starting with a letter"
        raise ConfigurationError(msg)
    if name in PLACEHOLDERS:
        msg = f"extra pattern name {name!r} is a built-in class; choose another name (built-ins: {list(CLASSES)})"
        raise ConfigurationError(msg)
    if not isinstance(spec, Mapping) or set(spec) != set(EXTRA_PATTERN_KEYS):
        keys = sorted(spec) if isinstance(spec, Mapping) else type(spec).__name__
        msg = f"extra pattern {name!r} must be a dict with exactly the keys {list(EXTRA_PATTERN_KEYS)}, got {keys}"
        raise ConfigurationError(msg)
    source, placeholder = spec["regex"], spec["placeholder"]
    if not isinstance(source, str) or not source:
        msg = f"extra pattern {name!r}: 'regex' must be a non-empty string, got {source!r}"
        raise ConfigurationError(msg)
    if not isinstance(placeholder, str) or not PLACEHOLDER_PATTERN.fullmatch(placeholder):
        msg = (
            f"extra pattern {name!r}: placeholder {placeholder!r} is not allowed: use '[REDACTED-<NAME>]' "
            "with NAME of 1 to 41 characters from A-Z, 0-9, '_' and '-' (e.g. '[REDACTED-EMAIL]')"
        )
        raise ConfigurationError(msg)
    try:
        regex = re.compile(source)
    except re.error as e:
        msg = f"extra pattern {name!r}: regex {source!r} does not compile: {e}"
        raise ConfigurationError(msg) from None
    if regex.match("") is not None:
        msg = f"extra pattern {name!r}: regex {source!r} matches the empty string; it must match at least one character"
        raise ConfigurationError(msg)
    if regex.search(placeholder) is not None:
        msg = f"extra pattern {name!r}: regex {source!r} matches its own placeholder {placeholder!r}"
        raise ConfigurationError(msg)
    return Rule(name, name, regex, placeholder)


def compile_policy(
    enabled_classes: Sequence[str] | None = None,
    extra_patterns: Mapping[str, Mapping[str, str]] | None = None,
) -> RedactionPolicy:
    """Validate the settings and compile the rules.

    :param enabled_classes: Built-in classes to apply (default: all of :data:`CLASSES`).
    :param extra_patterns: More patterns, ``name -> {"regex": ..., "placeholder": "[REDACTED-...]"}``,
        run after the built-ins in the given order and counted under their name. A named group
        ``value`` in the regex limits the replacement to that group.
    :raises ConfigurationError: an unknown class, a bad name, regex or placeholder.
    """
    classes = _check_enabled(enabled_classes)
    rules = [rule for rule in BUILTIN_RULES if rule.cls in classes]
    if extra_patterns is not None:
        if not isinstance(extra_patterns, Mapping):
            msg = (
                f"extra_patterns must be a dict of name -> {{'regex': ..., 'placeholder': ...}}, got {extra_patterns!r}"
            )
            raise ConfigurationError(msg)
        rules += [_check_extra(name, spec) for name, spec in extra_patterns.items()]
    return RedactionPolicy(rules=tuple(rules))


@functools.lru_cache(maxsize=32)
def _cached_policy(classes: tuple[str, ...] | None, extra: str | None) -> RedactionPolicy:
    return compile_policy(classes, None if extra is None else json.loads(extra))


def redact(
    text: str,
    enabled_classes: Sequence[str] | None = None,
    extra_patterns: Mapping[str, Mapping[str, str]] | None = None,
) -> RedactionResult:
    """Replace private addresses, users' home directories and secrets in ``text`` with typed placeholders.

    :param text: Any text (a fact, a log line, a config snippet).
    :param enabled_classes: Built-in classes to apply (default: all, see :data:`CLASSES`).
    :param extra_patterns: More patterns, see :func:`compile_policy`.
    :returns: The redacted text and the replacements per class.
    :raises InvalidInputError: ``text`` is not a string.
    :raises ConfigurationError: the settings are not valid.
    """
    if not isinstance(text, str):
        msg = f"text must be a string, got {type(text).__name__}"
        raise InvalidInputError(msg)
    try:
        key = (
            None if enabled_classes is None else tuple(enabled_classes),
            None if extra_patterns is None else json.dumps(extra_patterns),
        )
        hash(key)
    except (TypeError, ValueError):
        key = None
    if key is None or isinstance(enabled_classes, str):
        return compile_policy(enabled_classes, extra_patterns).redact(text)  # validates, raises
    return _cached_policy(*key).redact(text)
