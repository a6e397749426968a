"""One fact superseding none is written by its statement alone, outside a transaction (no BEGIN / COMMIT round
trips). That statement refuses what needs more than itself (a superseded fact held again: its former successor
is detached in the same transaction; another scope's id: refused), writing nothing, and the transaction does it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import DatabaseError
from haystack_osa_memory.markers import add_marker
from haystack_osa_memory.store.facts import FactRepository
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from tests.conftest import row_counts
from tests.integration.test_store_recall import _fact_rows

pytestmark = pytest.mark.integration


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per transaction opened from now on (``Connection.transaction``)."""
    opened: list[str] = []
    transaction = psycopg.Connection.transaction

    def recording(self: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> Any:
        opened.append("transaction")
        return transaction(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "transaction", recording)
    return opened


def test_a_fact_is_written_without_a_transaction_of_its_own(
    memory: Memory, alice: Caller, transactions: list[str], pg_conn_str: str, config: MemoryConfig
) -> None:
    memory.store("The ledger keeps payments for seven years", caller=alice)  # reads the kill switches' list too
    transactions.clear()
    doc = memory.store("The billing service listens on port 8443", caller=alice)["document_id"]
    assert transactions == []
    counts = row_counts(pg_conn_str, config)
    assert (counts["org_documents"], counts["haystack_documents"], counts["osa_fact_terms"]) == (2, 2, 2)
    assert memory.read(doc, caller=alice)["status"] == "approved"
    # the same text again upserts in place, still alone
    transactions.clear()
    assert memory.store("The billing service listens on port 8443", caller=alice)["document_id"] == doc
    assert transactions == []
    assert row_counts(pg_conn_str, config)["org_documents"] == 2


def test_a_superseded_fact_stored_again_detaches_its_successor_in_a_transaction(
    memory: Memory, alice: Caller, transactions: list[str], pg_conn_str: str, config: MemoryConfig
) -> None:
    x = memory.store("The deploy window opens at 09:00", valid_from="2026-01-01", caller=alice)["document_id"]
    y = memory.store("The deploy window opens at 10:00", valid_from="2026-02-01", supersedes=[x], caller=alice)[
        "document_id"
    ]
    transactions.clear()
    # stored again without naming anything: it holds again, and y stops listing it
    back = memory.store("The deploy window opens at 09:00", valid_from="2026-03-01", caller=alice)
    assert back["document_id"] == x
    assert transactions == ["transaction"]
    read_x, read_y = memory.read(x, caller=alice), memory.read(y, caller=alice)
    assert read_x["status"] == "approved"
    assert "superseded_by" not in read_x
    assert x not in (read_y.get("supersedes") or [])
    stores = [
        a
        for a in LifecycleRepository(pg_conn_str, config).audit(assignment_id=alice.assignment_id)
        if a["action"] == "store"
    ]
    # one audit row for the store that held it again: the refused statement wrote none
    assert [s["document_id"] for s in stores] == [x, y, x]
    assert stores[-1]["details"]["held_again_after"] == y


def test_another_scopes_id_is_refused_with_nothing_written(pg_conn_str: str, config: MemoryConfig) -> None:
    repo = FactRepository(pg_conn_str, config)
    (taken,) = _fact_rows(config, ["A fact of the beta assignment"], "asg-beta")
    repo.write([taken])
    before = row_counts(pg_conn_str, config)
    # alpha's bytes claiming beta's document id: the upsert's scope check refuses it
    forged = (
        {**taken[0], "metadata": {"assignment_id": "asg-alpha"}},
        {**taken[1], "content": add_marker("forged", "asg-alpha")},
    )
    with pytest.raises(DatabaseError, match="belongs to another document"):
        repo.write([forged], audit={"actor": "tester", "action": "store"})
    assert row_counts(pg_conn_str, config) == before
