"""The exact path reads a scope and the query's terms in one statement (`SCOPE_RECALL_ROWS`), and reads the scope
again with the chunk fallback (`SCOPE_ROWS`) only when a fact lacks its recall row. Either way its hits are those
of the query's terms (`QUERY_TERMS`) and `SCOPE_ROWS` read apart, ranked by `exact_hits`: with and without a
query vector, with a time boost, for a query without lexemes and for an empty scope."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from haystack.components.embedders import MockDocumentEmbedder, MockTextEmbedder
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.candidates import ScopeHit, exact_hits
from haystack_osa_memory.store.facts import FactRepository
from haystack_osa_memory.store.parameters import text_array, vector_parameter
from haystack_osa_memory.store.ranking import RankingParams
from haystack_osa_memory.store.recall_rows import QueryTerms
from haystack_osa_memory.store.scope_memo import MAX_SKIPS
from haystack_osa_memory.store.scope_query import ScopeQuery
from tests.integration.test_scope_cache import fact, words_embedding

pytestmark = pytest.mark.integration

QUERIES = [
    "which port does billing listen on?",
    "search cluster region",
    "ledger payments timeout minutes",
    "the and of",  # stop words only: no lexemes
    "nothing matches zzzz",
]


@pytest.fixture
def exact_config(config: MemoryConfig) -> MemoryConfig:
    """Neither held nor kept in memory: every recall of a small scope takes the exact path."""
    return config.model_copy(update={"scope_cache_facts": 0})


def stored(config: MemoryConfig, caller: Caller, facts: int) -> FactRepository:
    memory = Memory(
        config,
        document_embedder=MockDocumentEmbedder(embedding_fn=words_embedding),
        text_embedder=MockTextEmbedder(embedding_fn=words_embedding),
    )
    for i in range(facts):
        memory.store(fact(i), caller=caller)
    memory.warm_up()
    assert memory.kb is not None
    return memory.kb.facts


def reference(
    repo: FactRepository,
    scope: ScopeQuery,
    query: str,
    embedding: list[float] | None,
    ranking: RankingParams,
    boost: QueryTerms | None,
) -> list[ScopeHit]:
    """The query's terms and `SCOPE_ROWS` read apart, as the exact path read them before."""
    with repo.reading() as conn, conn.cursor(binary=True) as cur:
        lexemes, hashes = repo.query_terms(query, conn=conn)
        boost_terms = boost.hashes if boost is not None and ranking.time_boost else []
        if boost is not None and boost_terms:
            lexemes = [*lexemes, *boost.lexemes]
        params = {
            **scope.params(repo.config.admitted_statuses),
            "language": repo.config.language,
            "embedding": vector_parameter(embedding),
            "lexemes": text_array(lexemes),
        }
        rows = cur.execute(repo.scope_rows_statement, params).fetchall()
    return exact_hits(rows, hashes, ranking, boost_terms)


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every statement sent through a cursor from now on."""
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def recording(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.decode() if isinstance(query, bytes) else query
        sent.append(text if isinstance(text, str) else text.as_string(self))
        return execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recording)
    return sent


def hits_of(
    repo: FactRepository, scope: ScopeQuery, query: str, embedding: Any, ranking: RankingParams, boost: Any
) -> list[ScopeHit]:
    return repo.scope_hits(scope, query=query, embedding=embedding, ranking=ranking, boost=boost)


@pytest.mark.parametrize("vector", [False, True], ids=["lexical", "hybrid"])
def test_one_statement_ranks_as_the_terms_and_rows_read_apart(
    exact_config: MemoryConfig, alice: Caller, statements: list[str], vector: bool
) -> None:
    repo = stored(exact_config, alice, 40)
    scope = ScopeQuery.of(alice.org_id, alice.assignment_id)
    boost = repo.query_terms("billing region")
    compared = 0
    for query in QUERIES:
        embedding = words_embedding(query) if vector else None
        for ranking, boosted in ((RankingParams(k=8), None), (RankingParams(k=5, time_boost=0.3), boost)):
            statements.clear()
            got = hits_of(repo, scope, query, embedding, ranking, boosted)
            scope_reads = [s for s in statements if "AS MATERIALIZED" in s]
            assert [s.split("(", 1)[0] for s in scope_reads] == ["WITH q"]
            assert not any("unnest(tsvector_to_array" in s and "AS MATERIALIZED" not in s for s in statements)
            assert got == reference(repo, scope, query, embedding, ranking, boosted)
            compared += bool(got)
    assert compared >= 6  # most queries find something: the comparison is not of empty lists


def test_a_fact_without_its_recall_row_reads_the_scope_again_with_the_fallback(
    exact_config: MemoryConfig, alice: Caller, statements: list[str]
) -> None:
    repo = stored(exact_config, alice, 12)
    with psycopg.connect(exact_config.pg_conn_str or "", autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "DELETE FROM {}.osa_fact_terms WHERE document_id = (SELECT min(document_id) FROM {}.osa_fact_terms)"
            ).format(sql.Identifier(exact_config.kb_schema), sql.Identifier(exact_config.kb_schema))
        )
    scope = ScopeQuery.of(alice.org_id, alice.assignment_id)
    boost = repo.query_terms("checkout")
    for query in QUERIES[:3]:
        for ranking, boosted in ((RankingParams(k=8), None), (RankingParams(k=5, time_boost=0.3), boost)):
            statements.clear()
            got = hits_of(repo, scope, query, None, ranking, boosted)
            scope_reads = [s for s in statements if "AS MATERIALIZED" in s]
            assert [s.split("(", 1)[0] for s in scope_reads] == ["WITH q", "WITH s AS MATERIALIZED "]
            assert got
            assert got == reference(repo, scope, query, None, ranking, boosted)
    assert len(hits_of(repo, scope, fact(0), None, RankingParams(k=50), None)) == 12  # the fact without one too


def test_an_empty_scope_has_no_hits(exact_config: MemoryConfig, alice: Caller, bob: Caller) -> None:
    repo = stored(exact_config, alice, 3)
    scope = ScopeQuery.of(bob.org_id, bob.assignment_id)
    assert hits_of(repo, scope, "billing", None, RankingParams(k=8), None) == []


def scope_reads(statements: list[str]) -> list[str]:
    """The statements that read a scope, by their first words: the print, the kept rows, the facts stored since
    they were read, the exact path's."""
    names = {
        "SELECT q.*, p.*": "print",
        "WITH m AS": "kept rows",
        "SELECT m.document_id, m.expires_at": "since",
        "WITH q(lexemes": "one",
        "WITH s AS": "apart",
    }
    return [name for s in statements for prefix, name in names.items() if s.startswith(prefix)]


def recall_until(memory: Memory, caller: Caller, statements: list[str], reads: list[str]) -> None:
    """Recall until the scope is read as ``reads`` says (the memo keeps a changed scope's rows again only once two
    prints in a row agree, after skipping up to `scope_memo.MAX_SKIPS` recalls)."""
    for _ in range(2 * MAX_SKIPS + 4):
        statements.clear()
        memory.recall("billing port", caller=caller)
        if scope_reads(statements) == reads:
            return
    raise AssertionError(f"the scope was never read as {reads}")


def kept_scope(config: MemoryConfig, caller: Caller, statements: list[str]) -> Memory:
    """Lexical memory with 10 facts in ``caller``'s scope, whose rows it keeps: recalled from them."""
    memory = Memory(config, use_default_embedders=False)
    for i in range(10):
        memory.store(fact(i), caller=caller)
    recall_until(memory, caller, statements, ["print"])  # answered from the rows kept
    return memory


def test_a_scope_found_changed_by_its_print_catches_up_or_takes_the_one_statement(
    config: MemoryConfig, alice: Caller, statements: list[str]
) -> None:
    memory = kept_scope(config, alice, statements)
    other = Memory(config.model_copy(update={"scope_cache_facts": 0}), use_default_embedders=False)
    # A store of another process: this one's rows kept do not know its fact (its own would join them). The facts
    # stored since the rows were read make the print: they are read alone.
    other.store(fact(10), caller=alice)
    statements.clear()
    first = memory.recall("billing port", caller=alice)["facts"]
    assert scope_reads(statements) == ["print", "since"]
    # A fact superseded as well: the facts stored since do not make the print; the exact path, in one statement.
    other.store(fact(11), supersedes=[first[0]["document_id"]], caller=alice)
    statements.clear()
    memory.recall("billing port", caller=alice)
    assert scope_reads(statements) == ["print", "since", "one"]


def test_a_scope_kept_as_unusable_reads_the_fallback_at_once(
    config: MemoryConfig, alice: Caller, statements: list[str]
) -> None:
    memory = kept_scope(config, alice, statements)
    first = memory.recall("billing port", caller=alice)["facts"]
    with psycopg.connect(config.pg_conn_str or "", autocommit=True) as conn:
        conn.execute(
            sql.SQL("DELETE FROM {0}.osa_fact_terms WHERE document_id = %s").format(sql.Identifier(config.kb_schema)),
            (first[-1]["document_id"],),
        )
    # The rows read again: one lacks its recall row, so they are not kept, and the exact path needs the fallback.
    recall_until(memory, alice, statements, ["print", "kept rows", "apart"])
    statements.clear()
    again = memory.recall("billing port", caller=alice)["facts"]
    assert scope_reads(statements) == ["apart"]  # SCOPE_ROWS at once, not the one statement and then it
    assert [f["document_id"] for f in again] == [f["document_id"] for f in first]
    assert len(first) >= 2
