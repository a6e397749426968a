"""A real `osa-memory console` process beside a real `osa-memory serve`, and headless Chromium driven by
Selenium (Debian's `chromium` and `chromium-driver`; `SE_OFFLINE=true`: nothing is downloaded)."""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from tests.conftest import free_port
from tests.e2e.conftest import OSA_MEMORY, Server, env_for

CHROMIUM = os.environ.get("OSA_MEMORY_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("OSA_MEMORY_CHROMEDRIVER", "/usr/bin/chromedriver")
AXE = Path(__file__).resolve().parent / "node_modules" / "axe-core" / "axe.min.js"
SETUP_HINT = (
    "the console's browser tests need Debian's chromium and chromium-driver and axe-core: "
    "`apt-get install -y chromium chromium-driver` and `npm ci --prefix tests/e2e/console` (scripts/test.sh does both)"
)


@dataclass
class ConsoleProcess:
    """`osa-memory console` on a free port, next to ``server``."""

    server: Server
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    extra: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = env_for(self.server.config, self.server.pg_conn_str)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *OSA_MEMORY,
                    "console",
                    "--port",
                    str(self.port),
                    "--serve-status",
                    f"http://127.0.0.1:{self.server.port}/status",
                    "--log-level",
                    "warning",
                    *self.extra,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"osa-memory console exited with {self.proc.returncode}:\n{self.log.read_text()}")
            with suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/signin", timeout=1).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"osa-memory console did not answer within 60 s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def chromium(width: int = 1280, height: int = 900) -> webdriver.Chrome:
    """Headless Chromium from Debian's packages, with its console log readable (CSP reports land there)."""
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager never fetches a browser or driver
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise RuntimeError(f"{path} is missing: {SETUP_HINT}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    return driver


#: What chromedriver says of an element read while its page is being replaced (an "unknown error").
STALE_NODE = "does not belong to the document"


def wait_for_text(driver: webdriver.Chrome, text: str, css: str = "main", timeout: float = 15) -> str:
    """The text of ``css`` once it contains ``text`` (a form post's answer page has loaded)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def found(d: webdriver.Chrome) -> str | bool:
        try:
            shown = str(d.find_element(By.CSS_SELECTOR, css).text)
        except WebDriverException as e:
            # An element of the page being replaced, read as the new one arrives: chromedriver answers "unknown
            # error: ... Node with given id does not belong to the document", not a stale element (docs/traps.md).
            if STALE_NODE in str(e.msg or ""):
                return False
            raise
        return shown if text in shown else False

    wait = WebDriverWait(driver, timeout, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
    return str(wait.until(found))


def sign_in(driver: webdriver.Chrome, base: str, token: str) -> None:
    driver.get(f"{base}/signin")
    from selenium.webdriver.support.ui import WebDriverWait

    field_ = driver.find_element(By.ID, "token")
    field_.send_keys(token)
    field_.submit()
    # The answer page: signed in (the header names the person) or refused (an error on the sign-in page).
    WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".who, .error"))


def csp_reports(driver: webdriver.Chrome) -> list[str]:
    """Console messages about the Content-Security-Policy since the last call."""
    return [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]


def axe_violations(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """Serious and critical axe-core violations of the current page."""
    if not AXE.exists():
        raise RuntimeError(f"{AXE} is missing: {SETUP_HINT}")
    # The page's CSP forbids inline script; WebDriver's script injection is not subject to it.
    driver.execute_script(AXE.read_text(encoding="utf-8"))
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations))"
        ".catch(e => done([{id: 'error', impact: 'critical', description: String(e)}]));"
    )
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n.get("target") for n in v.get("nodes", [])][:5]}
        for v in result
        if v.get("impact") in ("serious", "critical")
    ]


def overflows(driver: webdriver.Chrome) -> bool:
    """Whether the page scrolls horizontally."""
    return bool(driver.execute_script("return document.documentElement.scrollWidth > window.innerWidth + 1;"))
