"""The server's log scrubbing: every record of any logger and handler, Hayhooks' loguru logger, and uncaught
exceptions are made safe to write (no request dump, no tool name a client chose, no secret)."""

from __future__ import annotations

import io
import logging
import sys
import threading
from collections.abc import Iterator

import pytest
from loguru import logger as loguru_logger

from haystack_osa_memory.mcp.server import install_log_scrubbing, scrub_log_text

AWS = "AKIAZ7Q3MXK2P9RT4WLB"
GITHUB = "ghp_R8mQ2xVt7LpK4nZw9YcB3sHd6JfG1aE5uN0o"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVbNm1234567"


@pytest.fixture
def scrubbed() -> Iterator[None]:
    """install_log_scrubbing() for one test; the process's logging is put back afterwards."""
    factory, hook, thread_hook = logging.getLogRecordFactory(), sys.excepthook, threading.excepthook
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    install_log_scrubbing()
    yield
    logging.setLogRecordFactory(factory)
    sys.excepthook, threading.excepthook = hook, thread_hook
    logging.captureWarnings(False)
    root.setLevel(level)
    root.handlers[:] = handlers
    loguru_logger.configure(patcher=None)


def capture(name: str, *, propagate: bool = False) -> tuple[logging.Logger, io.StringIO]:
    """A logger with a handler of its own, made after the scrubbing was installed."""
    stream = io.StringIO()
    log = logging.getLogger(name)
    log.handlers[:] = [logging.StreamHandler(stream)]
    log.setLevel(logging.DEBUG)
    log.propagate = propagate
    return log, stream


def test_a_secret_split_between_template_and_argument_is_redacted_for_a_handler_added_later(scrubbed: None) -> None:
    log, stream = capture("osa.test.later")
    log.warning("deploy with password=%s and key %s", "Hunter2-xyzzy!", AWS)
    written = stream.getvalue()
    assert "Hunter2" not in written
    assert AWS[4:] not in written
    assert "[REDACTED-PASSWORD]" in written


def test_the_sdk_notification_dump_and_an_unknown_tool_name_are_cut(scrubbed: None) -> None:
    log, stream = capture("mcp.shared.session.test")
    dump = f"Failed to validate notification: 1 error. Message was: {{'arguments': {{'fact': 'tangerine {GITHUB}'}}}}"
    log.warning(dump)  # as the MCP SDK logs it: an f-string
    log.warning("Tool '%s' not listed, no validation will be performed", f"name-{GITHUB}")
    log.debug("Received message: %s", {"params": {"query": "tangerine"}})
    written = stream.getvalue()
    assert "tangerine" not in written
    assert GITHUB[4:] not in written
    assert "Failed to validate notification (details not logged" in written
    assert "a tool that is not served was called (name not logged)" in written


def test_an_exception_message_in_a_traceback_is_redacted(scrubbed: None) -> None:
    log, stream = capture("osa.test.exc")
    try:
        raise ValueError(f"bad token {JWT}")
    except ValueError:
        log.exception("tool failed")
    written = stream.getvalue()
    assert "Traceback" in written
    assert JWT.rsplit(".", 1)[-1] not in written


def test_access_log_keeps_its_shape_without_query_string(scrubbed: None) -> None:
    from uvicorn.logging import AccessFormatter

    log, stream = capture("uvicorn.access")
    log.handlers[0].setFormatter(AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s'))
    log.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", AWS, f"/mcp/{GITHUB}?token={JWT}", "1.1", 404)
    written = stream.getvalue()
    assert written.startswith('127.0.0.1:5000 - "[REDACTED-SECRET] /mcp/[REDACTED-SECRET] HTTP/1.1" 404')
    assert "token=" not in written


def test_logging_error_report_prints_no_raw_argument(scrubbed: None, capsys: pytest.CaptureFixture[str]) -> None:
    class Broken(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                raise OSError("disk full")
            except OSError:
                self.handleError(record)

    log = logging.getLogger("osa.test.broken")
    log.handlers[:] = [Broken()]
    log.propagate = False
    raise_exceptions = logging.raiseExceptions
    logging.raiseExceptions = True
    try:
        log.error("stored %s", f"secret={GITHUB}")
    finally:
        logging.raiseExceptions = raise_exceptions
    assert GITHUB[4:] not in capsys.readouterr().err


def test_hayhooks_loguru_lines_are_scrubbed(scrubbed: None) -> None:
    stream = io.StringIO()
    sink = loguru_logger.add(stream, level="TRACE", format="{message} {extra}")
    try:
        loguru_logger.debug(
            "Calling pipeline as tool '{}' with arguments: {}", "kb_memory_store", {"fact": "tangerine"}
        )
        loguru_logger.bind(header=f"Bearer {GITHUB}").info("request with {}", AWS)
        try:
            raise RuntimeError(f"connection postgresql://app:S3cret-pw9@db/app {AWS}")
        except RuntimeError:
            loguru_logger.exception("failed")
    finally:
        loguru_logger.remove(sink)
    written = stream.getvalue()
    assert "tangerine" not in written
    assert GITHUB[4:] not in written
    assert AWS[4:] not in written
    assert "S3cret-pw9" not in written
    assert "Calling pipeline as tool (details not logged" in written


def test_uncaught_exceptions_are_scrubbed(scrubbed: None, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        raise KeyError(f"no such key {AWS}")
    except KeyError as e:
        sys.excepthook(type(e), e, e.__traceback__)
    thread = threading.Thread(target=lambda: (_ for _ in ()).throw(RuntimeError(f"in thread {GITHUB}")))
    thread.start()
    thread.join()
    err = capsys.readouterr().err
    assert "KeyError" in err
    assert "RuntimeError" in err
    assert AWS[4:] not in err
    assert GITHUB[4:] not in err


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("serving MCP tools ['kb_memory_recall']", "serving MCP tools ['kb_memory_recall']"),
        ("GET /status 200 from 10.0.0.7", "GET /status 200 from 10.0.0.7"),  # addresses stay in the log
    ],
)
def test_ordinary_lines_stay(text: str, kept: str) -> None:
    assert scrub_log_text(text) == kept


def test_a_secret_hidden_by_percent_encoding_is_redacted_and_no_line_break_is_decoded() -> None:
    line = scrub_log_text(f'127.0.0.1:5000 - "GET /x%20{GITHUB}%0Afake-line HTTP/1.1" 404')
    assert GITHUB[4:] not in line
    assert "\n" not in line
    assert line == '127.0.0.1:5000 - "GET /x [REDACTED-SECRET]%0Afake-line HTTP/1.1" 404'
