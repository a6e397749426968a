"""Bearer tokens and console sessions. Only a sha256 of a secret is stored.

An ``agent`` token (the default) acts over MCP for one org and its granted assignments. A ``reviewer``
or ``admin`` token names a person and one org; it signs in to the review console only, where it is
exchanged once for a server-side session (`ConsoleSessions`), and is refused over MCP.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import sql

from haystack_osa_memory.caller import Caller, SwitchReading
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import AuthenticationError, InvalidInputError
from haystack_osa_memory.markers import check_identifier
from haystack_osa_memory.privacy.gate import redact_optional
from haystack_osa_memory.store.database import read, rendered, transaction
from haystack_osa_memory.store.facts import INSERT_AUDIT
from haystack_osa_memory.store.lifecycle import SWITCHED_OFF

TOKEN_PREFIX = "osam_"  # noqa: S105 - a public prefix, not a secret
_TOKEN = re.compile(r"^osam_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_DURATION = re.compile(r"^(\d{1,6})([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

AGENT = "agent"
REVIEWER = "reviewer"
ADMIN = "admin"
ROLES = (AGENT, REVIEWER, ADMIN)
CONSOLE_ROLES = (REVIEWER, ADMIN)
NAME_MAX = 80
_NAME = re.compile(r"^[^\x00-\x1f\x7f\u202a-\u202e\u2066-\u2069]{1,80}$")

INSERT_TOKEN = sql.SQL(
    """INSERT INTO {schema}.tokens
    (token_id, secret_sha256, org_id, assignment_id, specialist_id, expires_at, assignment_ids, role, display_name)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"""
)
SELECT_TOKEN = sql.SQL(
    """SELECT secret_sha256, org_id, assignment_id, specialist_id, expires_at, revoked_at, assignment_ids,
    role, display_name FROM {schema}.tokens WHERE token_id = %s"""
)
# The same row, and whether a kill switch has turned the token's scope off (`lifecycle.SWITCHED_OFF`): a served
# call's token check and switch check in one statement (`TokenStore.verify_call`).
SELECT_TOKEN_AND_SWITCH = sql.SQL(
    """SELECT t.secret_sha256, t.org_id, t.assignment_id, t.specialist_id, t.expires_at, t.revoked_at,
    t.assignment_ids, t.role, t.display_name, {switched_off} FROM {schema}.tokens t WHERE t.token_id = %s"""
)
REVOKE_TOKEN = sql.SQL(
    """UPDATE {schema}.tokens SET revoked_at = coalesce(revoked_at, now()) WHERE token_id = %s
    RETURNING token_id, org_id"""
)
# Revoking a token ends its console sessions in the same transaction.
END_TOKEN_SESSIONS = sql.SQL(
    "UPDATE {schema}.console_sessions SET ended_at = coalesce(ended_at, now()) WHERE token_id = %s"
)
# now() of the database, so a replay judges expiry by the same clock that stamped expires_at.
TOKEN_ACTIVE = sql.SQL(
    """SELECT revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
    FROM {schema}.tokens WHERE token_id = %s"""
)
LIST_TOKENS = sql.SQL(
    """SELECT token_id, org_id, coalesce(assignment_ids, ARRAY[assignment_id]), specialist_id, created_at,
    expires_at, revoked_at, role, display_name FROM {schema}.tokens
    WHERE (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text) ORDER BY created_at, token_id"""
)
ORG_OF_TOKEN = sql.SQL("SELECT org_id FROM {schema}.tokens WHERE token_id = %s")

INSERT_SESSION = sql.SQL(
    """INSERT INTO {schema}.console_sessions (session_sha256, token_id, org_id, role, display_name, expires_at)
    VALUES (%s, %s, %s, %s, %s, now() + %s)"""
)
# A session holds while it is not ended, neither idle nor past its absolute expiry, and its token is
# neither revoked nor expired (checked on every request, so revoking the token ends it at once).
SELECT_SESSION = sql.SQL(
    """SELECT s.token_id, s.org_id, s.role, s.display_name, s.expires_at,
    s.last_seen_at < now() - %(touch)s
    FROM {schema}.console_sessions s JOIN {schema}.tokens t ON t.token_id = s.token_id
    WHERE s.session_sha256 = %(sha)s AND s.ended_at IS NULL AND s.expires_at > now()
      AND s.last_seen_at > now() - %(idle)s
      AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now()) AND t.role = s.role"""
)
# At most one write per session per `touch` interval: idle expiry is that coarse, requests stay reads.
TOUCH_SESSION = sql.SQL(
    "UPDATE {schema}.console_sessions SET last_seen_at = now() WHERE session_sha256 = %s AND ended_at IS NULL"
)
END_SESSION = sql.SQL(
    "UPDATE {schema}.console_sessions SET ended_at = coalesce(ended_at, now()) WHERE session_sha256 = %s"
)


@dataclass(frozen=True)
class IssuedToken:
    """A freshly created token; ``token`` is shown once and never stored."""

    token_id: str
    token: str
    caller: Caller
    expires_at: datetime | None


@dataclass(frozen=True)
class IssuedPersonToken:
    """A freshly created reviewer or admin token; ``token`` is shown once and never stored."""

    token_id: str
    token: str
    identity: ConsoleIdentity
    expires_at: datetime | None


def parse_duration(text: str) -> timedelta:
    """``30s``, ``15m``, ``8h`` or ``30d`` as a timedelta."""
    match = _DURATION.fullmatch(text.strip())
    if not match or int(match.group(1)) == 0:
        msg = f"duration {text!r} is not allowed: use a positive number followed by s, m, h or d (e.g. 8h)"
        raise InvalidInputError(msg)
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def check_person_name(name: str) -> str:
    """A reviewer's display name: 1-80 printable characters (no control or bidirectional-override characters).

    Raises:
        InvalidInputError: empty, too long or with such characters.
    """
    cleaned = (name or "").strip()
    if not _NAME.fullmatch(cleaned):
        msg = (
            f"name {name!r} is not allowed: 1-{NAME_MAX} printable characters, without control or "
            "bidirectional-override characters"
        )
        raise InvalidInputError(msg)
    return cleaned


@dataclass(frozen=True)
class ConsoleIdentity:
    """A person signed in to the review console: one org, a role (``reviewer`` or ``admin``), a name."""

    token_id: str
    org_id: str
    role: str
    name: str

    @property
    def actor(self) -> str:
        """Who acts, for the audit: role, token id and the person's name."""
        return f"{self.role}:{self.token_id}:{self.name}"

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN


class TokenStore:
    """Create, verify and revoke tokens.

    Usage:
    ```python
    tokens = TokenStore(conn_str, MemoryConfig())
    issued = tokens.create(org_id="acme", assignment_id="asg-1", expires_in=parse_duration("8h"))
    caller = tokens.verify(issued.token)
    ```
    """

    def __init__(self, conn_str: str, config: MemoryConfig) -> None:
        self.conn_str = conn_str
        self.config = config
        schema = sql.Identifier(config.memory_schema)
        self._insert = INSERT_TOKEN.format(schema=schema)
        # Rendered once (`database.rendered`): every call's token is checked with it.
        self._select = rendered(SELECT_TOKEN.format(schema=schema))
        token_scope = {"org": sql.SQL("t.org_id"), "assignment": sql.SQL("t.assignment_id")}
        self._select_with_switch = rendered(
            SELECT_TOKEN_AND_SWITCH.format(schema=schema, switched_off=SWITCHED_OFF.format(mem=schema, **token_scope))
        )
        self._revoke = REVOKE_TOKEN.format(schema=schema)
        self._active = TOKEN_ACTIVE.format(schema=schema)
        self._list = LIST_TOKENS.format(schema=schema)
        self._end_sessions = END_TOKEN_SESSIONS.format(schema=schema)
        self._org_of = ORG_OF_TOKEN.format(schema=schema)
        self._audit = INSERT_AUDIT.format(mem=schema)

    def create(
        self,
        *,
        org_id: str,
        assignment_id: str,
        specialist_id: str | None = None,
        expires_in: timedelta | None = None,
        extra_assignments: Sequence[str] = (),
    ) -> IssuedToken:
        """Create an agent token for ``assignment_id`` (its default) and any ``extra_assignments``."""
        check_identifier(org_id, "org")
        check_identifier(assignment_id, "assignment")
        grants = list(dict.fromkeys((assignment_id, *extra_assignments)))
        for grant in grants:
            check_identifier(grant, "assignment")
        if specialist_id is not None:
            check_identifier(specialist_id, "specialist")
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        expires_at = datetime.now(UTC) + expires_in if expires_in else None
        with transaction(self.conn_str, self.config) as conn:
            conn.execute(
                self._insert,
                (token_id, _digest(secret), org_id, assignment_id, specialist_id, expires_at, grants, AGENT, None),
            )
        caller = Caller(
            org_id=org_id,
            assignment_id=assignment_id,
            specialist_id=specialist_id,
            token_id=token_id,
            grants=tuple(grants),
        )
        return IssuedToken(
            token_id=token_id, token=f"{TOKEN_PREFIX}{token_id}_{secret}", caller=caller, expires_at=expires_at
        )

    def create_person(
        self, *, org_id: str, role: str, name: str, expires_in: timedelta | None = None
    ) -> IssuedPersonToken:
        """Create a ``reviewer`` or ``admin`` token for one person of one org (console sign-in only).

        Raises:
            InvalidInputError: unknown role, bad org or name.
        """
        if role not in CONSOLE_ROLES:
            msg = f"role {role!r} is not allowed for a person: use one of {list(CONSOLE_ROLES)} (agents: {AGENT!r})"
            raise InvalidInputError(msg)
        check_identifier(org_id, "org")
        # The name is shown on every page and written into every audit row of this person: redacted like
        # any free text first.
        name = check_person_name(redact_optional(name, self.config.redaction_off) or "")
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        expires_at = datetime.now(UTC) + expires_in if expires_in else None
        with transaction(self.conn_str, self.config) as conn:
            conn.execute(self._insert, (token_id, _digest(secret), org_id, None, None, expires_at, None, role, name))
        return IssuedPersonToken(
            token_id=token_id,
            token=f"{TOKEN_PREFIX}{token_id}_{secret}",
            identity=ConsoleIdentity(token_id=token_id, org_id=org_id, role=role, name=name),
            expires_at=expires_at,
        )

    def _row(self, token: str, statement: bytes | None = None) -> tuple[str, tuple[Any, ...]]:
        """The verified row of a live token (secret compared in constant time), read with ``statement``
        (`SELECT_TOKEN` by default; its columns first).

        Raises:
            AuthenticationError: malformed, unknown, wrong secret, expired or revoked (one message for all).
        """
        denied = AuthenticationError("invalid, expired or revoked token")
        match = _TOKEN.fullmatch(token or "")
        if not match:
            raise denied
        token_id, secret = match.groups()
        with read(self.conn_str, self.config) as conn:  # one statement: no BEGIN/COMMIT round trips
            row = conn.execute(statement or self._select, (token_id,)).fetchone()
        if row is None:
            # Same work as a known id, so timing does not tell which ids exist.
            hmac.compare_digest(_digest(secret), _digest(secret[::-1]))
            raise denied
        if not hmac.compare_digest(row[0], _digest(secret)):
            raise denied
        expires_at, revoked_at = row[4], row[5]
        if revoked_at is not None or (expires_at is not None and expires_at <= datetime.now(UTC)):
            raise denied
        return token_id, tuple(row)

    def verify(self, token: str) -> Caller:
        """The caller an agent token stands for (what `/mcp` and the REST wrappers accept).

        Raises:
            AuthenticationError: malformed, unknown, wrong secret, expired, revoked, or a person's
                (reviewer or admin) token, which acts in the console only (one message for all).
        """
        return self.verify_with_expiry(token)[0]

    def verify_with_expiry(self, token: str) -> tuple[Caller, datetime | None]:
        """`verify`, and when the token expires (``None``: never): a cache of verified tokens must not
        serve one past its expiry, even while the database cannot be asked."""
        return self._agent(*self._row(token))

    def verify_call(self, token: str) -> tuple[Caller, datetime | None, SwitchReading]:
        """`verify_with_expiry`, and whether a kill switch has turned the caller's scope off, read in the same
        statement (`SELECT_TOKEN_AND_SWITCH`): what a served call's tool then uses (`caller.switch_read_for`)."""
        token_id, row = self._row(token, self._select_with_switch)
        caller, expires_at = self._agent(token_id, row)
        return caller, expires_at, SwitchReading(caller.org_id, caller.assignment_id, bool(row[9]), time.monotonic())

    @staticmethod
    def _agent(token_id: str, row: tuple[Any, ...]) -> tuple[Caller, datetime | None]:
        """The caller of an agent's verified token row, and when it expires."""
        _, org_id, assignment_id, specialist_id, expires_at, _, grants, role, _ = row[:9]
        if (role or AGENT) != AGENT or assignment_id is None:
            raise AuthenticationError("invalid, expired or revoked token")
        caller = Caller(
            org_id=org_id,
            assignment_id=assignment_id,
            specialist_id=specialist_id,
            token_id=token_id,
            grants=tuple(grants or ()),
        )
        return caller, expires_at

    def revoke(self, token_id: str, *, actor: str | None = None) -> bool:
        """Revoke a token by id and end its console sessions; ``False`` when no such token exists.

        :param actor: who revokes it (the console's person), recorded in the audit with the same transaction.
        """
        if not re.fullmatch(r"[0-9a-f]{16}", token_id or ""):
            msg = f"token id {token_id!r} is not allowed: 16 hexadecimal characters, as printed by `token create`"
            raise InvalidInputError(msg)
        with transaction(self.conn_str, self.config) as conn:
            row = conn.execute(self._revoke, (token_id,)).fetchone()
            if row is None:
                return False
            conn.execute(self._end_sessions, (token_id,))
            if actor is not None:
                conn.execute(
                    self._audit,
                    {
                        "actor": actor,
                        "action": "revoke_token",
                        "org_id": row[1],
                        "assignment_id": None,
                        "document_id": None,
                        "details": json.dumps({"token_id": token_id}),
                    },
                )
            return True

    def verify_person(self, token: str) -> ConsoleIdentity:
        """The person a reviewer or admin token stands for (console sign-in).

        Raises:
            AuthenticationError: as :meth:`verify`; an agent token is refused with its own message.
        """
        token_id, row = self._row(token)
        _, org_id, _, _, _, _, _, role, name = row
        if role not in CONSOLE_ROLES:
            msg = "an agent token cannot sign in to the console: use a reviewer or admin token (`token create --role`)"
            raise AuthenticationError(msg)
        return ConsoleIdentity(token_id=token_id, org_id=org_id, role=role, name=name or token_id)

    def person(self, token_id: str) -> ConsoleIdentity:
        """The person a live reviewer or admin token id stands for, without its secret: sign-in through a
        team's SSO proxy, which maps a login to a token id (docs/console.md).

        Raises:
            AuthenticationError: unknown, revoked or expired, or an agent token.
        """
        denied = AuthenticationError("invalid, expired or revoked token")
        if not re.fullmatch(r"[0-9a-f]{16}", token_id or ""):
            raise denied
        with read(self.conn_str, self.config) as conn:
            row = conn.execute(self._select, (token_id,)).fetchone()
        if row is None:
            raise denied
        _, org_id, _, _, expires_at, revoked_at, _, role, name = row
        if revoked_at is not None or (expires_at is not None and expires_at <= datetime.now(UTC)):
            raise denied
        if role not in CONSOLE_ROLES:
            raise denied
        return ConsoleIdentity(token_id=token_id, org_id=org_id, role=role, name=name or token_id)

    def org_of(self, token_id: str) -> str | None:
        """The org a token id belongs to, or ``None`` when there is no such token."""
        if not re.fullmatch(r"[0-9a-f]{16}", token_id or ""):
            return None
        with read(self.conn_str, self.config) as conn:
            row = conn.execute(self._org_of, (token_id,)).fetchone()
        return str(row[0]) if row else None

    def is_active(self, token_id: str) -> bool:
        """Whether the token ``token_id`` exists and is neither revoked nor expired right now.

        For work done earlier on the token's behalf (offline-buffer replays), where the secret is gone.

        Raises:
            DatabaseError: the database could not answer (the caller must not assume either way).
        """
        if not re.fullmatch(r"[0-9a-f]{16}", token_id or ""):
            return False
        with transaction(self.conn_str, self.config) as conn:
            row = conn.execute(self._active, (token_id,)).fetchone()
        return row is not None and bool(row[0])

    def list(self, org_id: str | None = None) -> list[dict[str, Any]]:
        """Every token's metadata (never a secret); only ``org_id``'s when given."""
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._list, {"org_id": org_id}).fetchall()
        keys = (
            "token_id",
            "org_id",
            "assignments",
            "specialist_id",
            "created_at",
            "expires_at",
            "revoked_at",
            "role",
            "name",
        )
        out = [dict(zip(keys, row, strict=True)) for row in rows]
        for item in out:
            item["assignments"] = [a for a in item["assignments"] or () if a is not None]
            item["role"] = item["role"] or AGENT
        return out


@dataclass(frozen=True)
class ConsoleSession:
    """A live console session: who, and whether its last-seen time was just refreshed."""

    identity: ConsoleIdentity
    expires_at: datetime


def session_digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("ascii", "replace")).hexdigest()


class ConsoleSessions:
    """Server-side sessions of the review console; the cookie carries a random id, the table its sha256.

    Usage:
    ```python
    sessions = ConsoleSessions(conn_str, MemoryConfig(), idle=timedelta(minutes=30), absolute=timedelta(hours=8))
    session_id = sessions.start(identity)
    session = sessions.get(session_id)  # None once ended, idle, expired, or its token revoked
    ```
    """

    def __init__(self, conn_str: str, config: MemoryConfig, *, idle: timedelta, absolute: timedelta) -> None:
        self.conn_str = conn_str
        self.config = config
        self.idle = idle
        self.absolute = absolute
        # Refresh the last-seen time at most every minute (less for short idle limits).
        self.touch = min(timedelta(minutes=1), idle / 4)
        schema = sql.Identifier(config.memory_schema)
        self._insert = INSERT_SESSION.format(schema=schema)
        self._select = SELECT_SESSION.format(schema=schema)
        self._touch = TOUCH_SESSION.format(schema=schema)
        self._end = END_SESSION.format(schema=schema)

    def start(self, identity: ConsoleIdentity) -> str:
        """A new session for ``identity``; its id is returned once (for the cookie), only its hash is kept."""
        session_id = secrets.token_urlsafe(32)
        with transaction(self.conn_str, self.config) as conn:
            conn.execute(
                self._insert,
                (
                    session_digest(session_id),
                    identity.token_id,
                    identity.org_id,
                    identity.role,
                    identity.name,
                    self.absolute,
                ),
            )
        return session_id

    def get(self, session_id: str | None) -> ConsoleSession | None:
        """The live session of ``session_id``, or ``None``."""
        if not session_id or len(session_id) > 128:
            return None
        digest = session_digest(session_id)
        with read(self.conn_str, self.config) as conn:
            row = conn.execute(self._select, {"sha": digest, "idle": self.idle, "touch": self.touch}).fetchone()
            if row is None:
                return None
        token_id, org_id, role, name, expires_at, stale = row
        if stale:
            with transaction(self.conn_str, self.config) as conn:
                conn.execute(self._touch, (digest,))
        return ConsoleSession(ConsoleIdentity(token_id, org_id, role, name), expires_at)

    def end(self, session_id: str | None) -> None:
        """End a session (logout); nothing happens for an unknown id."""
        if not session_id or len(session_id) > 128:
            return
        with transaction(self.conn_str, self.config) as conn:
            conn.execute(self._end, (session_digest(session_id),))
