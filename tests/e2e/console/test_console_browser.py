"""The review console in a real browser (headless Chromium), with a real `osa-memory serve` beside it: agents
act over MCP, a reviewer acts in the browser, and each side sees the other's effect.

Screenshots of every page go to a temporary folder; `OSA_MEMORY_SCREENSHOTS_DIR=docs/console` writes them
into the docs instead (docs/console.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement

from haystack_osa_memory.store.tokens import TokenStore
from tests.e2e.conftest import Server, call
from tests.e2e.console.browser import (
    ConsoleProcess,
    axe_violations,
    chromium,
    csp_reports,
    overflows,
    sign_in,
    wait_for_text,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ASSIGNMENT = "asg-console"


@pytest.fixture(scope="module")
def console(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleProcess]:
    proc = ConsoleProcess(server, tmp_path_factory.mktemp("console") / "console.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def driver() -> Iterator[webdriver.Chrome]:
    browser = chromium()
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def fresh(driver: webdriver.Chrome, console: ConsoleProcess) -> webdriver.Chrome:
    """The module's browser with no session and an empty console log."""
    driver.get(f"{console.url}/signin")
    driver.delete_all_cookies()
    driver.get_log("browser")
    return driver


def person(server: Server, role: str = "reviewer", org: str = "acme", name: str = "Ana Silva", **kw: Any) -> str:
    return TokenStore(server.pg_conn_str, server.config).create_person(org_id=org, role=role, name=name, **kw).token


def agent(server: Server, org: str = "acme", assignment: str = ASSIGNMENT) -> str:
    return str(server.token(assignment, org)["token"])


def propose(server: Server, token: str, title: str, body: str, paths: list[str] | None = None) -> str:
    is_error, answer = call(
        server.url, token, "kb_memory_propose", {"kind": "fact", "title": title, "body": body, "paths": paths or []}
    )
    assert not is_error, answer
    assert "document_id" in answer, answer
    return str(answer["document_id"])


def recalled(server: Server, token: str, query: str) -> list[str]:
    is_error, answer = call(server.url, token, "kb_memory_recall", {"query": query})
    assert not is_error, answer
    return [f["document_id"] for f in answer["facts"]]


def button(driver: webdriver.Chrome, element_id: str) -> WebElement:
    return driver.find_element(By.ID, element_id)


def no_alert(driver: webdriver.Chrome) -> bool:
    try:
        driver.switch_to.alert  # noqa: B018 - raises when no dialog is open
    except NoAlertPresentException:
        return True
    return False


def test_sign_in_out_and_an_expired_session(fresh: webdriver.Chrome, console: ConsoleProcess, server: Server) -> None:
    fresh.get(f"{console.url}/queue")
    assert fresh.current_url.endswith("/signin?m=expired")
    sign_in(fresh, console.url, "osam_0000000000000000_" + "x" * 43)
    wait_for_text(fresh, "invalid, expired or revoked token")
    sign_in(fresh, console.url, person(server))
    assert fresh.current_url == f"{console.url}/queue"
    assert "Ana Silva" in fresh.find_element(By.CSS_SELECTOR, ".who").text
    cookie = fresh.get_cookie("osam_console")
    assert cookie is not None
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert fresh.execute_script("return document.cookie") == ""  # HttpOnly: no script reads it
    fresh.find_element(By.CSS_SELECTOR, "form[action='/signout'] button").click()
    wait_for_text(fresh, "You are signed out")
    assert fresh.current_url.endswith("/signin?m=out")
    fresh.get(f"{console.url}/queue")
    assert fresh.current_url.endswith("/signin?m=expired")

    sign_in(fresh, console.url, person(server, expires_in=timedelta(seconds=3)))
    assert fresh.current_url == f"{console.url}/queue"
    time.sleep(3.5)
    fresh.get(f"{console.url}/queue")
    assert fresh.current_url.endswith("/signin?m=expired")
    wait_for_text(fresh, "session ended")


def test_agent_proposes_reviewer_accepts_with_the_keyboard_agent_recalls(
    fresh: webdriver.Chrome, console: ConsoleProcess, server: Server
) -> None:
    token = agent(server)
    doc = propose(server, token, "Ingest restarts", "Restart the ingest worker after each schema deploy on lumen.")
    assert doc not in recalled(server, token, "restart ingest worker lumen")
    sign_in(fresh, console.url, person(server))
    fresh.find_element(By.CSS_SELECTOR, f"a[href='/facts/{doc}']").click()
    assert fresh.find_element(By.CSS_SELECTOR, "pre.content").get_property("textContent") == (
        "Ingest restarts\n\nRestart the ingest worker after each schema deploy on lumen."
    )
    # Keyboard only: focus the note field, type, tab to the Accept button, press Enter.
    note = fresh.find_element(By.ID, "accept-note")
    fresh.execute_script("arguments[0].focus()", note)
    active = fresh.switch_to.active_element
    active.send_keys("checked with the runbook")
    active.send_keys(Keys.TAB)
    assert fresh.switch_to.active_element.get_attribute("id") == "accept"
    fresh.switch_to.active_element.send_keys(Keys.ENTER)
    wait_for_text(fresh, "Accepted")
    assert doc in recalled(server, token, "restart ingest worker lumen")
    assert csp_reports(fresh) == []


def test_rejected_is_never_recalled_and_flagged_is_restored(
    fresh: webdriver.Chrome, console: ConsoleProcess, server: Server
) -> None:
    token = agent(server)
    doc = propose(server, token, "Cafeteria", "The cafeteria on floor nine serves pizza on Mondays.")
    stored_error, stored = call(server.url, token, "kb_memory_store", {"fact": "The quasar cluster runs on port 7443."})
    assert not stored_error, stored
    flagged = stored["document_id"]
    for _ in range(2):
        is_error, voted = call(
            server.url, agent(server), "kb_memory_feedback", {"document_id": flagged, "verdict": "flag"}
        )
        assert not is_error, voted
    assert voted["status"] == "flagged"
    assert flagged not in recalled(server, token, "quasar cluster port")

    sign_in(fresh, console.url, person(server))
    fresh.get(f"{console.url}/facts/{doc}")
    fresh.find_element(By.ID, "reject-note").send_keys("not about the work")
    button(fresh, "reject").click()
    wait_for_text(fresh, "Rejected")
    assert doc not in recalled(server, token, "cafeteria pizza mondays")

    fresh.get(f"{console.url}/queue?status=flagged")
    assert flagged in fresh.page_source
    fresh.get(f"{console.url}/facts/{flagged}")
    button(fresh, "restore").click()
    wait_for_text(fresh, "Restored")
    assert flagged in recalled(server, token, "quasar cluster port")


def test_the_kill_switch_from_the_browser(fresh: webdriver.Chrome, console: ConsoleProcess, server: Server) -> None:
    token = agent(server)
    sign_in(fresh, console.url, person(server, role="admin", name="Bo Admin"))
    fresh.get(f"{console.url}/switches")
    fresh.find_element(By.ID, "sw-assignment").send_keys(ASSIGNMENT)
    fresh.find_element(By.ID, "sw-reason").send_keys("incident 42")
    fresh.find_element(By.CSS_SELECTOR, "form[aria-label='Turn memory off'] button").click()
    wait_for_text(fresh, "Switch changed")
    assert "incident 42" in fresh.find_element(By.TAG_NAME, "table").text
    is_error, text = call(server.url, token, "kb_memory_recall", {"query": "anything"})
    assert is_error
    assert text == "Memory is off for this assignment"
    fresh.find_element(By.XPATH, f"//button[normalize-space()='Turn on {ASSIGNMENT}']").click()
    wait_for_text(fresh, "Every switch is on")
    is_error, answer = call(server.url, token, "kb_memory_recall", {"query": "anything"})
    assert not is_error, answer


def test_another_orgs_fact_is_a_404_and_person_tokens_are_refused_on_mcp(
    fresh: webdriver.Chrome, console: ConsoleProcess, server: Server
) -> None:
    doc = propose(server, agent(server, org="acme"), "Acme only", "Acme deploys on Tuesdays through the blue gate.")
    sign_in(fresh, console.url, person(server, org="globex", name="Cy Globex"))
    fresh.get(f"{console.url}/facts/{doc}")
    assert fresh.find_element(By.TAG_NAME, "h1").text == "Not found"
    assert "Acme deploys" not in fresh.page_source
    for role in ("reviewer", "admin"):
        answer = httpx.post(
            server.url,
            headers={
                "authorization": f"Bearer {person(server, role=role)}",
                "accept": "application/json, text/event-stream",
            },
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            timeout=10,
        )
        assert answer.status_code == 401


def test_a_form_posted_from_another_origin_is_refused(
    fresh: webdriver.Chrome, console: ConsoleProcess, server: Server, tmp_path: Path
) -> None:
    """A page on another origin (same site: another port) posts an accept form to the console; the browser
    sends the session cookie, the console refuses the post."""
    import http.server
    import threading

    doc = propose(server, agent(server), "Cross origin", "The moth gateway rotates its keys every ninety days.")
    (tmp_path / "index.html").write_text(
        f'<html lang="en"><body><form method="post" action="{console.url}/facts/{doc}">'
        '<input type="hidden" name="action" value="accept"><input type="hidden" name="csrf" value="guess">'
        '<button id="go" type="submit">go</button></form></body></html>',
        encoding="utf-8",
    )
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        sign_in(fresh, console.url, person(server))
        fresh.get(f"http://127.0.0.1:{evil.server_address[1]}/index.html")
        fresh.find_element(By.ID, "go").click()
        wait_for_text(fresh, "not sent from the console's own pages")
    finally:
        evil.shutdown()
    fresh.get(f"{console.url}/facts/{doc}")
    assert fresh.find_element(By.CSS_SELECTOR, ".pill").text == "proposed"


XSS_PAYLOADS = {
    "script": "<script>alert('script')</script>",
    "handler": '<img src=x onerror="alert(\'img\')"><a href="#" onclick="alert(1)">click</a>',
    "svg": "<svg onload=alert('svg')><animate onbegin=alert(1) attributeName=x dur=1s></svg>",
    "css": '</pre><style>body{display:none}</style><div style="background:url(javascript:alert(1))">x</div>',
    "rtl": "Approve invoice \u202egnp.exe\u202c for the \u2067team\u2069 now",
    "long": "A" * 1000 + "B" * 1000,
    "markdown": (
        "# Title\n\n<details open ontoggle=alert(1)>**bold** [link](javascript:alert(1))</details>\n"
        "```html\n<b>x</b>\n```"
    ),
}


def test_stored_xss_is_inert_text(fresh: webdriver.Chrome, console: ConsoleProcess, server: Server) -> None:
    token = agent(server)
    docs = {}
    for name, payload in XSS_PAYLOADS.items():
        if name == "long":  # a whole fact of one 2,000-character line: stored, as a proposal adds its title
            is_error, stored = call(server.url, token, "kb_memory_store", {"fact": payload})
            assert not is_error, stored
            docs[name] = stored["document_id"]
            continue
        paths = ["javascript:alert('path')", "https://example.com/runbook"] if name == "script" else []
        docs[name] = propose(server, token, f"{name} <i>title</i>", payload, paths)
    sign_in(fresh, console.url, person(server))
    fresh.get(f"{console.url}/queue?assignment={ASSIGNMENT}")
    assert no_alert(fresh)
    for name, doc in docs.items():
        fresh.get(f"{console.url}/facts/{doc}")
        assert no_alert(fresh), name
        shown = fresh.find_element(By.CSS_SELECTOR, "pre.content").get_property("textContent")
        if name == "long":
            assert shown == XSS_PAYLOADS[name]
        else:
            assert shown == f"{name} <i>title</i>\n\n{XSS_PAYLOADS[name]}", name
            assert fresh.find_element(By.CSS_SELECTOR, "p.title").text == f"{name} <i>title</i>"
        assert (
            fresh.execute_script(
                "return document.querySelectorAll('main script, main svg, main img, main style').length"
            )
            == 0
        )
        assert fresh.find_element(By.TAG_NAME, "body").is_displayed()
        assert not overflows(fresh), name
    fresh.get(f"{console.url}/facts/{docs['script']}")
    hrefs = [a.get_attribute("href") for a in fresh.find_elements(By.CSS_SELECTOR, "main a")]
    assert "https://example.com/runbook" in hrefs
    assert not any(h and h.lower().startswith("javascript:") for h in hrefs)
    assert csp_reports(fresh) == []


def _pages(console: ConsoleProcess, doc: str) -> dict[str, str]:
    return {
        "queue": f"{console.url}/queue",
        "fact": f"{console.url}/facts/{doc}",
        "assignments": f"{console.url}/assignments",
        "browse": f"{console.url}/assignments/{ASSIGNMENT}",
        "switches": f"{console.url}/switches",
        "audit": f"{console.url}/audit",
        "tokens": f"{console.url}/tokens",
        "health": f"{console.url}/health",
    }


@pytest.mark.parametrize("width", [390, 1280])
def test_every_page_is_accessible_and_fits_the_width(
    fresh: webdriver.Chrome, console: ConsoleProcess, server: Server, width: int
) -> None:
    body = {390: "The lantern service keeps logs for thirty days.", 1280: "Quokka database backups run nightly at two."}
    doc = propose(server, agent(server), f"Width {width}", body[width])
    fresh.set_window_size(width, 900)
    try:
        fresh.get(f"{console.url}/signin")
        assert axe_violations(fresh) == []
        assert not overflows(fresh)
        sign_in(fresh, console.url, person(server, role="admin", name="Bo Admin"))
        for name, url in _pages(console, doc).items():
            fresh.get(url)
            assert axe_violations(fresh) == [], name
            assert not overflows(fresh), (name, width)
        assert csp_reports(fresh) == []
    finally:
        fresh.set_window_size(1280, 900)


def test_every_page_screenshots(
    fresh: webdriver.Chrome, console: ConsoleProcess, server: Server, tmp_path: Path
) -> None:
    """PNG of every page; into docs/console with OSA_MEMORY_SCREENSHOTS_DIR=docs/console, else a temporary folder."""
    out = Path(os.environ.get("OSA_MEMORY_SCREENSHOTS_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    token = agent(server)
    doc = propose(server, token, "Deploy gate", "Deploys of the billing service go through the staging gate first.")
    propose(server, token, "Port change", "The search service moved from port 9200 to 9300 in March.")
    fresh.set_window_size(1280, 900)
    fresh.get(f"{console.url}/signin")
    fresh.save_screenshot(str(out / "signin.png"))
    sign_in(fresh, console.url, person(server, role="admin", name="Bo Admin"))
    taken = ["signin.png"]
    for name, url in _pages(console, doc).items():
        fresh.get(url)
        fresh.save_screenshot(str(out / f"{name}.png"))
        taken.append(f"{name}.png")
    fresh.set_window_size(390, 900)
    fresh.get(f"{console.url}/queue")
    fresh.save_screenshot(str(out / "queue-390.png"))
    fresh.set_window_size(1280, 900)
    taken.append("queue-390.png")
    for name in taken:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
