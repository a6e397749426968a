"""Bearer tokens bound to one org and assignment. Only a sha256 of the secret is stored."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import sql

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import AuthenticationError, InvalidInputError
from haystack_osa_memory.markers import check_identifier
from haystack_osa_memory.store.database import read, transaction

TOKEN_PREFIX = "osam_"  # noqa: S105 - a public prefix, not a secret
_TOKEN = re.compile(r"^osam_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_DURATION = re.compile(r"^(\d{1,6})([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

INSERT_TOKEN = sql.SQL(
    """INSERT INTO {schema}.tokens
    (token_id, secret_sha256, org_id, assignment_id, specialist_id, expires_at, assignment_ids)
    VALUES (%s, %s, %s, %s, %s, %s, %s)"""
)
SELECT_TOKEN = sql.SQL(
    """SELECT secret_sha256, org_id, assignment_id, specialist_id, expires_at, revoked_at, assignment_ids
    FROM {schema}.tokens WHERE token_id = %s"""
)
REVOKE_TOKEN = sql.SQL(
    "UPDATE {schema}.tokens SET revoked_at = coalesce(revoked_at, now()) WHERE token_id = %s RETURNING token_id"
)
# now() of the database, so a replay judges expiry by the same clock that stamped expires_at.
TOKEN_ACTIVE = sql.SQL(
    """SELECT revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
    FROM {schema}.tokens WHERE token_id = %s"""
)
LIST_TOKENS = sql.SQL(
    """SELECT token_id, org_id, coalesce(assignment_ids, ARRAY[assignment_id]), specialist_id, created_at,
    expires_at, revoked_at FROM {schema}.tokens ORDER BY created_at"""
)


@dataclass(frozen=True)
class IssuedToken:
    """A freshly created token; ``token`` is shown once and never stored."""

    token_id: str
    token: str
    caller: Caller
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
        self._select = SELECT_TOKEN.format(schema=schema)
        self._revoke = REVOKE_TOKEN.format(schema=schema)
        self._active = TOKEN_ACTIVE.format(schema=schema)
        self._list = LIST_TOKENS.format(schema=schema)

    def create(
        self,
        *,
        org_id: str,
        assignment_id: str,
        specialist_id: str | None = None,
        expires_in: timedelta | None = None,
        extra_assignments: Sequence[str] = (),
    ) -> IssuedToken:
        """Create a token for ``assignment_id`` (its default) and any ``extra_assignments``."""
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
                self._insert, (token_id, _digest(secret), org_id, assignment_id, specialist_id, expires_at, grants)
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

    def verify(self, token: str) -> Caller:
        """The caller a token stands for.

        Raises:
            AuthenticationError: malformed, unknown, wrong secret, expired or revoked (one message for all).
        """
        denied = AuthenticationError("invalid, expired or revoked token")
        match = _TOKEN.fullmatch(token or "")
        if not match:
            raise denied
        token_id, secret = match.groups()
        with read(self.conn_str, self.config) as conn:  # one statement: no BEGIN/COMMIT round trips
            row = conn.execute(self._select, (token_id,)).fetchone()
        if row is None:
            raise denied
        digest, org_id, assignment_id, specialist_id, expires_at, revoked_at, grants = row
        if not hmac.compare_digest(digest, _digest(secret)):
            raise denied
        if revoked_at is not None or (expires_at is not None and expires_at <= datetime.now(UTC)):
            raise denied
        return Caller(
            org_id=org_id,
            assignment_id=assignment_id,
            specialist_id=specialist_id,
            token_id=token_id,
            grants=tuple(grants or ()),
        )

    def revoke(self, token_id: str) -> bool:
        """Revoke a token by id; ``False`` when no such token exists."""
        if not re.fullmatch(r"[0-9a-f]{16}", token_id or ""):
            msg = f"token id {token_id!r} is not allowed: 16 hexadecimal characters, as printed by `token create`"
            raise InvalidInputError(msg)
        with transaction(self.conn_str, self.config) as conn:
            return conn.execute(self._revoke, (token_id,)).fetchone() is not None

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

    def list(self) -> list[dict[str, Any]]:
        """Every token's metadata (never a secret)."""
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._list).fetchall()
        keys = ("token_id", "org_id", "assignments", "specialist_id", "created_at", "expires_at", "revoked_at")
        return [dict(zip(keys, row, strict=True)) for row in rows]
