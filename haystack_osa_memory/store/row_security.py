"""Who may see and change which rows: row-level security for facts (opt-in), and the rights of the runtime
and console roles. `osa-memory init` (`haystack_osa_memory.store.schema`) runs these steps on request."""

from __future__ import annotations

from collections.abc import Callable

from psycopg import sql

from haystack_osa_memory.markers import MARKER_PREFIX, MARKER_SUFFIX
from haystack_osa_memory.store.facts import FACT_SOURCE
from haystack_osa_memory.store.steps import (
    ACCESS_EXCLUSIVE,
    ACCESS_EXCLUSIVE_IF_PRESENT,
    NO_TABLE_LOCK,
    Names,
    Statement,
    Step,
    chunk_table,
    gov_table,
    mem_table,
    no_table,
    terms_table,
)

# -- row-level security (opt-in: `osa-memory init --row-level-security`) ---------------------------
# A fact row is visible only to a transaction whose scope settings (set by our code from the
# authenticated caller, `haystack_osa_memory.store.database`) name its org and assignment; every other row
# stays exactly as visible as before. A session that sets no scope (a team's pipeline, psql) reads
# no fact. FORCE: the tables' owner is held to the policies too (superusers and BYPASSRLS roles never are).
SCOPE_ORG = "osa_memory.org_id"
SCOPE_ASSIGNMENT = "osa_memory.assignment_id"
_SCOPE_ORG = sql.SQL("current_setting({}, true)").format(sql.Literal(SCOPE_ORG))
_SCOPE_ASSIGNMENT = sql.SQL("current_setting({}, true)").format(sql.Literal(SCOPE_ASSIGNMENT))
ENABLE_RLS = sql.SQL("ALTER TABLE {schema}.{table} ENABLE ROW LEVEL SECURITY")
FORCE_RLS = sql.SQL("ALTER TABLE {schema}.{table} FORCE ROW LEVEL SECURITY")
DROP_POLICY = sql.SQL("DROP POLICY IF EXISTS {policy} ON {schema}.{table}")
GOV_OTHERS_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_others ON {schema}.{table}
    USING (source IS DISTINCT FROM {source}) WITH CHECK (source IS DISTINCT FROM {source})"""
)
GOV_SCOPE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_scope ON {schema}.{table}
    USING (source = {source} AND org_id = {org} AND metadata->>'assignment_id' = {assignment})
    WITH CHECK (source = {source} AND org_id = {org} AND metadata->>'assignment_id' = {assignment})"""
)
# A chunk is a fact when its text starts with the scope marker; it is visible when that marker names the
# scope's assignment and its metadata the scope's org. Self-contained on purpose: a new row is checked
# (an upsert checks it against USING too) before its governing row, written in the same statement, is
# visible. osa_fact_terms carries the scope in its own columns (version 9) for the same reason.
CHUNK_OTHERS_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_others ON {schema}.{table}
    USING (NOT starts_with(coalesce(content, ''), {marker}))
    WITH CHECK (NOT starts_with(coalesce(content, ''), {marker}))"""
)
CHUNK_SCOPE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_scope ON {schema}.{table}
    USING (starts_with(content, {marker} || {assignment} || {suffix}) AND meta->>'org_id' = {org})
    WITH CHECK (starts_with(content, {marker} || {assignment} || {suffix}) AND meta->>'org_id' = {org})"""
)
TERMS_SCOPE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_scope ON {schema}.osa_fact_terms
    USING (org_id = {org} AND assignment_id = {assignment})
    WITH CHECK (org_id = {org} AND assignment_id = {assignment})"""
)


def _policy_values(n: Names) -> dict[str, sql.Composable]:
    return {
        "schema": n.kb,
        "gov": n.gov,
        "source": sql.Literal(FACT_SOURCE),
        "org": _SCOPE_ORG,
        "assignment": _SCOPE_ASSIGNMENT,
        "marker": sql.Literal(MARKER_PREFIX),
        "suffix": sql.Literal(MARKER_SUFFIX + "\n"),
    }


def _on_table(
    template: sql.SQL, table: Callable[[Names], sql.Identifier], **extra: sql.Composable
) -> Callable[[Names], Statement]:
    """A statement on one table, with the policy values (`_policy_values`) at hand."""

    def build(n: Names) -> Statement:
        return template.format(**{**_policy_values(n), "table": table(n), **extra})

    return build


def _gov_ident(n: Names) -> sql.Identifier:
    return n.gov


def _chunk_ident(n: Names) -> sql.Identifier:
    return n.chunk


def _terms_ident(n: Names) -> sql.Identifier:
    return sql.Identifier("osa_fact_terms")


_RLS_TABLES: tuple[
    tuple[Callable[[Names], sql.Identifier], Callable[[Names], str | None], tuple[sql.SQL, ...]], ...
] = (
    (_gov_ident, gov_table, (GOV_OTHERS_POLICY, GOV_SCOPE_POLICY)),
    (_chunk_ident, chunk_table, (CHUNK_OTHERS_POLICY, CHUNK_SCOPE_POLICY)),
    (_terms_ident, terms_table, (TERMS_SCOPE_POLICY,)),
)


def _rls_steps() -> tuple[Step, ...]:
    steps: list[Step] = []
    for ident, label, policies in _RLS_TABLES:
        for policy in ("osa_memory_others", "osa_memory_scope"):
            steps.append(
                Step(_on_table(DROP_POLICY, ident, policy=sql.Identifier(policy)), label, ACCESS_EXCLUSIVE_IF_PRESENT)
            )
        steps += [Step(_on_table(template, ident), label, ACCESS_EXCLUSIVE) for template in policies]
        steps += [Step(_on_table(statement, ident), label, ACCESS_EXCLUSIVE) for statement in (ENABLE_RLS, FORCE_RLS)]
    return tuple(steps)


RLS_STEPS = _rls_steps()
DISABLE_RLS = sql.SQL("ALTER TABLE {schema}.{table} NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY")


def rls_off_steps() -> tuple[Step, ...]:
    """Row-level security off on the fact tables (the policies stay, unused)."""
    return tuple(Step(_on_table(DISABLE_RLS, ident), label, ACCESS_EXCLUSIVE) for ident, label, _ in _RLS_TABLES)


# Whether facts are under row-level security: both flags and our scope policy (what `init` reports).
RLS_ENABLED = sql.SQL(
    """SELECT c.relrowsecurity AND c.relforcerowsecurity
       AND EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid AND p.polname = 'osa_memory_scope')
    FROM pg_class c WHERE c.oid = to_regclass(%s)"""
)

# -- the runtime role (`osa-memory init --runtime-role NAME`): the rows `serve` needs, no DDL -------
GRANTS: tuple[tuple[sql.SQL, Callable[[Names], str | None]], ...] = (
    (sql.SQL("GRANT USAGE ON SCHEMA {kb} TO {role}"), no_table),
    (sql.SQL("GRANT USAGE ON SCHEMA {mem} TO {role}"), no_table),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE ON {kb}.{gov} TO {role}"), gov_table),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {kb}.{chunk} TO {role}"), chunk_table),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {kb}.osa_fact_terms TO {role}"), terms_table),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {mem}.feedback, {mem}.reads TO {role}"), no_table),
    (sql.SQL("GRANT SELECT, INSERT ON {mem}.audit TO {role}"), mem_table("audit")),
    (sql.SQL("GRANT SELECT ON {mem}.tokens, {mem}.switches, {mem}.schema_version TO {role}"), no_table),
    (sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {mem} TO {role}"), no_table),
)


def _grant(statement: sql.SQL, role: str) -> Callable[[Names], Statement]:
    def build(n: Names) -> Statement:
        return statement.format(kb=n.kb, mem=n.mem, gov=n.gov, chunk=n.chunk, role=sql.Identifier(role))

    return build


def grant_steps(role: str) -> tuple[Step, ...]:
    """Grant ``role`` the rows `serve` needs (`GRANTS`)."""
    return tuple(Step(_grant(statement, role), label, NO_TABLE_LOCK) for statement, label in GRANTS)


# -- the console role (`osa-memory init --console-role NAME`): what the review console does, no more ---
# Review transitions and forget (status and metadata of governing rows; a forgotten fact's chunk, terms,
# votes and reads), kill switches, audit rows, token sign-in and revocation, its own sessions. Never
# INSERT on the fact tables (the console stores no fact) and never DDL.
CONSOLE_GRANTS: tuple[tuple[sql.SQL, Callable[[Names], str | None]], ...] = (
    (sql.SQL("GRANT USAGE ON SCHEMA {kb} TO {role}"), no_table),
    (sql.SQL("GRANT USAGE ON SCHEMA {mem} TO {role}"), no_table),
    (sql.SQL("GRANT SELECT, UPDATE ON {kb}.{gov} TO {role}"), gov_table),
    (sql.SQL("GRANT SELECT, DELETE ON {kb}.{chunk} TO {role}"), chunk_table),
    (sql.SQL("GRANT SELECT, DELETE ON {kb}.osa_fact_terms TO {role}"), terms_table),
    (sql.SQL("GRANT SELECT, DELETE ON {mem}.feedback, {mem}.reads TO {role}"), no_table),
    (sql.SQL("GRANT SELECT, INSERT ON {mem}.audit TO {role}"), mem_table("audit")),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {mem}.switches TO {role}"), no_table),
    (sql.SQL("GRANT SELECT, UPDATE (revoked_at) ON {mem}.tokens TO {role}"), no_table),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE ON {mem}.console_sessions TO {role}"), no_table),
    (sql.SQL("GRANT SELECT ON {mem}.schema_version TO {role}"), no_table),
    (sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {mem} TO {role}"), no_table),
)
# With row-level security on, the console role sees the facts of the org its session names (the scope
# setting's org, `haystack_osa_memory.store.database.fact_scope`), any assignment, and no other org's.
CONSOLE_POLICY = "osa_memory_console"
GOV_CONSOLE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_console ON {schema}.{table} TO {role}
    USING (source = {source} AND org_id = {org}) WITH CHECK (source = {source} AND org_id = {org})"""
)
CHUNK_CONSOLE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_console ON {schema}.{table} TO {role}
    USING (starts_with(content, {marker}) AND meta->>'org_id' = {org})
    WITH CHECK (starts_with(content, {marker}) AND meta->>'org_id' = {org})"""
)
TERMS_CONSOLE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_console ON {schema}.osa_fact_terms TO {role}
    USING (org_id = {org}) WITH CHECK (org_id = {org})"""
)
_CONSOLE_POLICIES = (
    (_gov_ident, gov_table, GOV_CONSOLE_POLICY),
    (_chunk_ident, chunk_table, CHUNK_CONSOLE_POLICY),
    (_terms_ident, terms_table, TERMS_CONSOLE_POLICY),
)


def console_steps(role: str, *, policies: bool) -> tuple[Step, ...]:
    """Grant ``role`` what the review console needs (`CONSOLE_GRANTS`); with ``policies``, also the policies
    that show it one org's facts at a time (row-level security on)."""
    steps = [Step(_grant(statement, role), label, NO_TABLE_LOCK) for statement, label in CONSOLE_GRANTS]
    if policies:
        for ident, label, template in _CONSOLE_POLICIES:
            steps.append(
                Step(
                    _on_table(DROP_POLICY, ident, policy=sql.Identifier(CONSOLE_POLICY)),
                    label,
                    ACCESS_EXCLUSIVE_IF_PRESENT,
                )
            )
            steps.append(Step(_on_table(template, ident, role=sql.Identifier(role)), label, ACCESS_EXCLUSIVE))
    return tuple(steps)
