"""What the log test sends and where it looks: every secret class in every position of a request, and every
server process with every log file it writes.

A server that writes logs registers itself with :func:`logged_server`: a context manager that starts it at a
given log level and yields a :class:`LoggedServer` (its endpoints, a token, and the log files to grep).
`tests/e2e/test_log_secrets.py` sends the whole matrix to each registered server, at the default and at
debug level, stops it, and greps every listed file for every secret.
"""

from __future__ import annotations

import base64
import json
import os
import secrets as random_source
import signal
import string
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from haystack_osa_memory.privacy.redaction import redact
from tests.conftest import free_port
from tests.e2e.conftest import OSA_MEMORY, wait_for_status


@dataclass(frozen=True)
class Secret:
    """One secret class: the text sent, and the part of it that must never be written to a log."""

    name: str
    text: str
    needle: str


def _random(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(random_source.choice(alphabet) for _ in range(n))


def _b64url(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def make_secrets(bearer_token: str) -> list[Secret]:
    """Fresh values of every secret class (random per run, so a match in a log is this run's leak).

    ``bearer_token``: one of the server's own valid tokens, also sent where it does not belong.
    """
    aws = "AKIA" + _random(16, string.ascii_uppercase + string.digits)
    github = "ghp_" + _random(36)
    slack = f"xoxb-{_random(12, string.digits)}-{_random(12, string.digits)}-{_random(24)}"
    stripe = "sk_live_" + _random(24)
    signature = _random(43, string.ascii_letters + string.digits + "-_")
    jwt = f"{_b64url({'alg': 'HS256', 'typ': 'JWT'})}.{_b64url({'sub': _random(12)})}.{signature}"
    password = "Pw-" + _random(16)
    db_password = "Db-" + _random(16)
    key_line = _random(64, string.ascii_letters + string.digits + "+/")
    private_key = f"-----BEGIN RSA PRIVATE KEY-----\n{key_line}\n{_random(64)}\n-----END RSA PRIVATE KEY-----"
    token_secret = bearer_token.split("_", 2)[2]  # osam_<token id>_<secret>; the secret may hold "_" itself
    assert len(token_secret) >= 32
    found = [
        Secret("aws_access_key", aws, aws[4:]),
        Secret("github_token", github, github[4:]),
        Secret("slack_token", slack, slack.rsplit("-", 1)[-1]),
        Secret("stripe_key", stripe, stripe[8:]),
        Secret("jwt", jwt, signature),
        Secret("password", f"password={password}", password),
        Secret("connection_string", f"postgresql://app:{db_password}@db.internal:5432/app", db_password),
        Secret("private_key", private_key, key_line),
        Secret("bearer_token", bearer_token, token_secret),
    ]
    for secret in found:  # the matrix tests the logs, not the redactor: each must be one it redacts
        assert secret.needle not in redact(secret.text).text, f"the redactor misses {secret.name}"
    return found


@dataclass
class LoggedServer:
    """A running server under test: where it answers, a valid token, and every file it writes logs to."""

    name: str
    #: Where the request bodies are posted (for a server without MCP: the endpoint that takes its bodies).
    mcp_url: str
    token: str
    #: Log files, and folders whose every file is a log (read at the end, after the server stopped).
    logs: list[Path]
    #: Other HTTP endpoints the same processes serve (they get the header, path and query string cases).
    other_urls: list[str] = field(default_factory=list)
    #: Requests only this server understands (e.g. a web page's forms), sent with the secrets ``s``: how many.
    own_requests: Callable[[str], int] | None = None
    #: Lines its log must hold at each level (the test cannot pass on an empty log); None: an MCP server's.
    expected_lines: dict[str, list[str]] | None = None

    def log_files(self) -> list[Path]:
        files: list[Path] = []
        for path in self.logs:
            if path.is_dir():
                files += sorted(p for p in path.rglob("*") if p.is_file())
            elif path.exists():
                files.append(path)
        return files


ServerFactory = Callable[[Path, str], AbstractContextManager[LoggedServer]]
#: Every server that writes logs, by name: ``factory(work_dir, log_level)``.
LOGGED_SERVERS: dict[str, ServerFactory] = {}


def logged_server(name: str) -> Callable[[ServerFactory], ServerFactory]:
    """Register a server for the log test (a context manager factory: ``(work_dir, log_level)``)."""

    def register(factory: ServerFactory) -> ServerFactory:
        LOGGED_SERVERS[name] = factory
        return factory

    return register


def _embedded_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PG_CONN_STR" and not k.startswith(("OSA_MEMORY_", "LOG"))}
    return {**env, "OSA_MEMORY_EMBEDDER": "none", "PYTHONUNBUFFERED": "1"}


def _logs(log: Path, data: Path) -> list[Path]:
    """A server's own output, PostgreSQL's log and anything else written in its data folder's top level."""
    return [log, data / "pgdata" / "log", *[p for p in data.glob("*") if p.is_file()]]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a graceful stop flushes the logs), then SIGKILL past a minute."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def _serve(work_dir: Path, log_level: str, workers: int, name: str) -> Iterator[LoggedServer]:
    """`osa-memory serve` on its own embedded database, with its metrics endpoint on."""
    data = work_dir / "data"
    log = work_dir / "serve.log"
    port, metrics_port = free_port(), free_port()
    command = [*OSA_MEMORY, "serve", "--data-dir", str(data), "--port", str(port), "--log-level", log_level]
    command += ["--workers", str(workers), "--metrics-port", str(metrics_port)]
    env = _embedded_env()
    with log.open("ab") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_status(proc, port, log, 180, "osa-memory serve")
        created = subprocess.run(
            [
                *OSA_MEMORY,
                "token",
                "create",
                "--org",
                "acme",
                "--assignment",
                "asg-logs",
                "--json",
                "--data-dir",
                str(data),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        token = json.loads(created.stdout)["token"]
        yield LoggedServer(
            name=name,
            mcp_url=f"http://127.0.0.1:{port}/mcp",
            token=token,
            logs=_logs(log, data),
            other_urls=[f"http://127.0.0.1:{metrics_port}/metrics"],
        )
    finally:
        _stop(proc)


@logged_server("serve-one-process")
def serve_one_process(work_dir: Path, log_level: str) -> AbstractContextManager[LoggedServer]:
    return _serve(work_dir, log_level, 1, "serve-one-process")


@logged_server("serve-two-workers")
def serve_two_workers(work_dir: Path, log_level: str) -> AbstractContextManager[LoggedServer]:
    return _serve(work_dir, log_level, 2, "serve-two-workers")


@logged_server("console")
@contextmanager
def console(work_dir: Path, log_level: str) -> Iterator[LoggedServer]:
    """`osa-memory console` on its own embedded database; a reviewer signed in posts every form with secrets."""
    data = work_dir / "data"
    log = work_dir / "console.log"
    env = _embedded_env()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*OSA_MEMORY, *args, "--data-dir", str(data)], env=env, capture_output=True, text=True, timeout=180
        )

    assert cli("init").returncode == 0
    made = cli("token", "create", "--role", "reviewer", "--org", "acme", "--name", "Log Check", "--json")
    assert made.returncode == 0, made.stderr
    reviewer = json.loads(made.stdout)["token"]
    port = free_port()
    command = [*OSA_MEMORY, "console", "--data-dir", str(data), "--port", str(port), "--log-level", log_level]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_status(proc, port, log, 180, "osa-memory console", path="/signin")

        def forms(s: str) -> int:
            origin = {"Origin": base}
            sent = 0
            with httpx.Client(base_url=base, timeout=30, headers=origin) as browser:
                for fields in ({"token": s}, {"token": reviewer, "next": s}, {"token": f"{reviewer} {s}"}):
                    with suppress(httpx.HTTPError):
                        browser.post("/signin", data=fields)
                    sent += 1
                with suppress(httpx.HTTPError):
                    browser.post("/signin", files={"token": ("token.txt", s.encode())})
                sent += 1
                signed = browser.post("/signin", data={"token": reviewer})
                assert signed.status_code == 303, signed.text
                page = browser.get("/queue").text
                csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0] if 'name="csrf"' in page else ""
                posts = [
                    ("/facts/" + "a" * 64, {"csrf": csrf, "action": "reject", "note": s}),
                    ("/facts/" + "a" * 64, {"csrf": csrf, "action": "forget", "reason": s}),
                    ("/queue/bulk", {"csrf": csrf, "action": "accept", "ids": s, "note": s}),
                    ("/switches", {"csrf": csrf, "org": s, "assignment": s, "reason": s, "enabled": "false"}),
                    ("/assignments/asg-logs", {"csrf": csrf, "query": s}),
                    ("/tokens/" + "b" * 16 + "/revoke", {"csrf": s}),
                    ("/signout", {"csrf": s}),
                ]
                for path, fields in posts:
                    with suppress(httpx.HTTPError):
                        browser.post(path, data=fields)
                    sent += 1
                for path in ("/queue", "/audit", "/audit.csv", "/assignments/" + s[:40], "/facts/" + s[:40]):
                    with suppress(httpx.HTTPError):
                        browser.get(path, params={"assignment": s, "actor": s, "q": s})
                    sent += 1
            return sent

        yield LoggedServer(
            name="console",
            mcp_url=f"{base}/signin",
            token=reviewer,
            logs=_logs(log, data),
            other_urls=[f"{base}/queue", f"{base}/health"],
            own_requests=forms,
            # the console keeps no access log (fact ids are in its paths); the sign-in above asserts it served
            expected_lines={
                "info": ["Uvicorn running on", "Application startup complete."],
                "debug": ["Uvicorn running on", "INFO:haystack_osa_memory.store.database:starting the embedded"],
            },
        )
    finally:
        _stop(proc)


# --- the positions -----------------------------------------------------------------------------------------

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _call(name: str, arguments: Any, request_id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    if request_id is not None:
        message["id"] = request_id
    return message


def _bodies(s: str) -> dict[str, bytes]:
    """JSON-RPC bodies with the secret ``s`` in every position of a message."""

    def dump(message: Any) -> bytes:
        return json.dumps(message).encode()

    return {
        "recall query argument": dump(_call("kb_memory_recall", {"query": f"where is {s}", "limit": 3})),
        "stored fact argument": dump(_call("kb_memory_store", {"fact": f"Logcheck: the deploy key is {s}"})),
        "topic argument": dump(_call("kb_memory_store", {"fact": "Logcheck fact", "topic": s})),
        "argument name": dump(_call("kb_memory_recall", {s: "x", "query": "q"})),
        "argument too long": dump(_call("kb_memory_recall", {"query": s * (1 + 1000 // len(s))})),
        "arguments not an object": dump(_call("kb_memory_recall", s)),
        "tool name": dump(_call(s, {"query": "q"})),
        "tools/call notification": dump(_call("kb_memory_store", {"fact": s}, request_id=None)),
        "other notification": dump({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"x": s}}),
        "request id": dump({"jsonrpc": "2.0", "id": s, "method": "tools/list"}),
        "method": dump({"jsonrpc": "2.0", "id": 1, "method": s}),
        "params of tools/list": dump({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": s}}),
        "batch": dump([_call("kb_memory_recall", {"query": s}, 2), _call("kb_memory_store", {"fact": s}, None)]),
        "malformed JSON": dump(_call("kb_memory_recall", {"query": s}))[:-3],
        "not JSON-RPC": dump({"secret": s}),
        "not UTF-8": dump(_call("kb_memory_recall", {"query": s}))[:-3] + b"\xff\xfe}}}",
        "nested deep": b"[" * 3000 + json.dumps(s).encode() + b"]" * 3000,
        "response from a client": dump({"jsonrpc": "2.0", "id": 99, "result": {"secret": s}}),
        "error from a client": dump({"jsonrpc": "2.0", "id": 99, "error": {"code": 1, "message": s}}),
    }


def send_matrix(server: LoggedServer, secrets: list[Secret]) -> int:
    """Send every secret in every position to ``server`` (all classes together in each position: the
    redaction of one must not let another through); the number of requests sent."""
    s = " ".join(secret.text for secret in secrets)
    auth = {"Authorization": f"Bearer {server.token}"}
    sent = 0

    def attempt(method: str, url: str, **kwargs: Any) -> None:
        nonlocal sent
        sent += 1
        with suppress(httpx.HTTPError), httpx.stream(method, url, timeout=30, **kwargs) as answer:
            if method != "GET":  # a GET of /mcp opens an event stream that never ends: its status is enough
                answer.read()  # a refused connection is an answer too; the log is what matters

    for body in _bodies(s).values():
        attempt("POST", server.mcp_url, content=body, headers={**MCP_HEADERS, **auth})
    # the same messages without a valid token (refused before anything runs)
    attempt("POST", server.mcp_url, content=_bodies(s)["tool name"], headers=MCP_HEADERS)
    # headers: the credential itself, and secrets in other headers
    one_line = s.replace("\n", " ")
    header_cases = [
        {"Authorization": f"Bearer {one_line}"},
        {"Authorization": f"Basic {base64.b64encode(f'user:{one_line}'.encode()).decode()}"},
        {**auth, "X-Api-Key": one_line, "User-Agent": one_line, "Cookie": f"session={one_line}"},
        {**auth, "Mcp-Session-Id": one_line, "Mcp-Protocol-Version": one_line, "Last-Event-ID": one_line},
    ]
    body = _bodies("q")["recall query argument"]
    for headers in header_cases:
        attempt("POST", server.mcp_url, content=body, headers={**MCP_HEADERS, **headers})
    attempt("GET", server.mcp_url, headers={**auth, "Accept": "text/event-stream", "Mcp-Session-Id": one_line})
    attempt("DELETE", server.mcp_url, headers={**auth, "Mcp-Session-Id": one_line})
    # query strings and paths, on every endpoint the server answers
    quoted = httpx.URL("http://x/").copy_with(path="/" + one_line).raw_path.decode()
    base = server.mcp_url.rsplit("/", 1)[0]
    for url in [server.mcp_url, f"{base}/status", *server.other_urls]:
        attempt("GET", url, params={"token": one_line, "q": one_line}, headers=auth)
        attempt("POST", url, params={"api_key": one_line}, content=body, headers={**MCP_HEADERS, **auth})
        attempt("GET", url.rsplit("/", 1)[0] + quoted, headers=auth)
    if server.own_requests is not None:
        sent += server.own_requests(s)
    # a secret as the HTTP method, where it is a valid method token
    for secret in secrets:
        if all(c in string.ascii_letters + string.digits + "_-" for c in secret.text):
            attempt(secret.text, server.mcp_url, content=body, headers={**MCP_HEADERS, **auth})
    return sent
