"""No secret sent to a server reaches any log it writes: every secret class in every position of a request
(arguments, tool names, ids, methods, headers, query strings, paths, malformed JSON, notifications, batches),
to every registered server (`tests/e2e/log_secrets.py`), at the default and at debug level."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.log_secrets import LOGGED_SERVERS, make_secrets, send_matrix

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

#: What shows that a level was really in force (so the test cannot pass on an empty log).
EXPECTED_LINES = {
    "info": ['"POST /mcp HTTP/1.1" 400', '"GET /status HTTP/1.1" 200', "Failed to validate notification"],
    "debug": [
        "Failed to validate notification",
        "Received message (details not logged",
        "Dispatching request of type",
    ],
}


def _leaks(files: list[Path], needle: str) -> list[str]:
    found = []
    for path in files:
        data = path.read_bytes()
        at = data.find(needle.encode())
        if at >= 0:
            context = data[max(0, at - 200) : at + 80].decode("utf-8", "replace")
            found.append(f"{path}: ...{context}")
    return found


@pytest.mark.parametrize("log_level", ["info", "debug"])
@pytest.mark.parametrize("server_name", sorted(LOGGED_SERVERS))
def test_no_secret_in_any_log(tmp_path: Path, server_name: str, log_level: str) -> None:
    with LOGGED_SERVERS[server_name](tmp_path, log_level) as server:
        secrets = make_secrets(server.token)
        sent = send_matrix(server, secrets)
    files = server.log_files()
    assert files, "the server wrote no log at all"
    text = "\n".join(p.read_bytes().decode("utf-8", "replace") for p in files)
    for line in (server.expected_lines or EXPECTED_LINES)[log_level]:
        assert line in text, f"{line!r} not logged: was the matrix ({sent} requests) served at {log_level}?"
    leaks = {secret.name: _leaks(files, secret.needle) for secret in secrets}
    assert {name: where for name, where in leaks.items() if where} == {}
    assert "Logcheck" not in text  # fact text is not logged either
    assert "Traceback" not in text
