"""`osa-memory serve --metrics-port` as a real process, driven by the official MCP client: the Prometheus
endpoint counts the calls and their typed errors, the OTLP exporter sends one span per tool call, and
neither the scrape nor any exported span holds fact text, a query, a token, an org or an assignment."""

from __future__ import annotations

import gzip
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from haystack_osa_memory.embedders import minilm_installed
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import free_port, new_schema_config
from tests.e2e.conftest import OSA_MEMORY, Server, call, env_for, serve_workers, serving, wait_for_status
from tests.unit.test_metrics import sample

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

RUN = uuid.uuid4().hex[:8]
ORG = f"org-metrics-{RUN}"
ASSIGNMENT = f"asg-metrics-{RUN}"
FACT = f"Quokka{RUN} deploys the billing service on Thursdays"
QUERY = f"when does quokka{RUN} deploy billing"
STRAY_ARGUMENT = f"zanzibar_{RUN}"
#: Minilm when installed, so that the query embedder runs (and reports its batch size).
EMBEDDER = "minilm" if minilm_installed() else "none"


class OtlpReceiver:
    """A minimal OTLP/HTTP trace receiver: keeps every export request it gets."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                bodies.append(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list[Any]:
        found = []
        for body in list(self.bodies):
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                for scope in resource.scope_spans:
                    found.extend(scope.spans)
        return found

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def attributes(span: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in span.attributes}


@dataclass
class MetricsServer(Server):
    """`serve --metrics-port`, exporting traces to ``otlp``."""

    otlp: str = ""
    workers: int = 1
    metrics_port: int = field(default_factory=free_port)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def env(self) -> dict[str, str]:
        return env_for(
            self.config,
            self.pg_conn_str,
            OTEL_EXPORTER_OTLP_ENDPOINT=self.otlp,
            OTEL_BSP_SCHEDULE_DELAY="100",
            OTEL_SERVICE_NAME="osa-memory-e2e",
        )

    def start(self) -> None:
        command = [*OSA_MEMORY, "serve", "--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        command += ["--workers", str(self.workers)]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*command, "--log-level", "warning"], env=self.env(), stdout=log, stderr=subprocess.STDOUT
            )
        wait_for_status(self.proc, self.port, self.log, 60, "osa-memory serve --metrics-port")

    def scrape(self) -> str:
        answer = httpx.get(self.metrics_url, timeout=10)
        assert answer.status_code == 200
        return answer.text


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    otlp = OtlpReceiver()
    yield otlp
    otlp.close()


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def metrics_server(
    request: pytest.FixtureRequest, pg_conn_str: str, tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[MetricsServer]:
    config = new_schema_config(pg_conn_str, embedder=EMBEDDER)
    ensure_schema(pg_conn_str, config)
    log = tmp_path_factory.mktemp("metrics") / "server.log"
    with serving(MetricsServer(config, pg_conn_str, log, otlp=receiver.endpoint, workers=request.param)) as srv:
        yield srv


def test_metrics_and_traces_of_tool_calls(metrics_server: MetricsServer, receiver: OtlpReceiver) -> None:
    receiver.bodies.clear()  # the other server's spans
    before = metrics_server.scrape()
    # The served tools' series exist from the start, at zero.
    assert sample(before, "osa_memory_tool_duration_seconds_count", tool="kb_memory_recall") == 0
    assert sample(before, "osa_memory_offline_queue_depth") == 0

    issued = metrics_server.token(ASSIGNMENT, ORG)
    token = issued["token"]
    url = metrics_server.url
    failed, stored = call(url, token, "kb_memory_store", {"fact": FACT, "topic": f"billing-{RUN}"})
    assert not failed, stored
    failed, recalled = call(url, token, "kb_memory_recall", {"query": QUERY})
    assert not failed
    assert FACT in [f["content"] for f in recalled["facts"]]
    failed, text = call(url, token, "kb_memory_forget", {"document_id": "e" * 64, "reason": f"gone {RUN}"})
    assert failed, text  # NotFoundError
    failed, text = call(url, token, "kb_memory_recall", {"query": QUERY, STRAY_ARGUMENT: 1})
    assert failed
    assert STRAY_ARGUMENT in text

    after = metrics_server.scrape()
    for tool, calls in (("kb_memory_store", 1), ("kb_memory_recall", 2), ("kb_memory_forget", 1)):
        counted = sample(after, "osa_memory_tool_duration_seconds_count", tool=tool)
        assert counted - sample(before, "osa_memory_tool_duration_seconds_count", tool=tool) == calls
        assert sample(after, "osa_memory_tool_duration_seconds_sum", tool=tool) > 0
    assert sample(after, "osa_memory_tool_errors_total", tool="kb_memory_forget", kind="NotFoundError") == 1
    assert sample(after, "osa_memory_tool_errors_total", tool="kb_memory_recall", kind="InvalidInputError") == 1
    assert not re.search(r'^osa_memory_tool_errors_total\{tool="kb_memory_store"', after, re.MULTILINE)
    assert sample(after, "osa_memory_db_pool_requests_total") > 0
    capacity = sample(after, "osa_memory_db_pool_max")
    assert capacity >= 8
    assert capacity % 8 == 0  # one process: 8 connections per pool it opened
    assert 1 <= sample(after, "osa_memory_db_pool_connections") <= capacity
    embedded = sample(after, "osa_memory_embed_batch_size_count")
    assert embedded == (1 if EMBEDDER == "minilm" else 0)  # one recall reached the embedder
    for secret in (FACT, f"Quokka{RUN}", f"quokka{RUN}", QUERY, token, issued["token_id"], ASSIGNMENT, ORG):
        assert secret not in after, secret

    # Traces: one span per tool call, exported over OTLP, beneath which Haystack's spans run.
    deadline = time.monotonic() + 20
    wanted = {"osa_memory.tool.kb_memory_store": 1, "osa_memory.tool.kb_memory_recall": 2}
    wanted["osa_memory.tool.kb_memory_forget"] = 1

    def exported() -> bool:
        names = [s.name for s in receiver.spans()]
        return all(names.count(name) >= n for name, n in wanted.items())

    while time.monotonic() < deadline and not exported():
        time.sleep(0.2)
    spans = receiver.spans()
    tool_spans = {s.name: [t for t in spans if t.name == s.name] for s in spans if s.name.startswith("osa_memory.")}
    assert set(wanted) <= set(tool_spans), sorted({s.name for s in spans})
    assert len(tool_spans["osa_memory.tool.kb_memory_recall"]) == 2
    forget = attributes(tool_spans["osa_memory.tool.kb_memory_forget"][0])
    assert forget["osa_memory.tool.status"] == "error"
    assert forget["osa_memory.tool.error_kind"] == "NotFoundError"
    recalls = [attributes(s) for s in tool_spans["osa_memory.tool.kb_memory_recall"]]
    ok = next(a for a in recalls if a["osa_memory.tool.status"] == "ok")
    assert ok["osa_memory.tool.result_count"] >= 1
    assert any(a.get("osa_memory.tool.error_kind") == "InvalidInputError" for a in recalls)
    store = tool_spans["osa_memory.tool.kb_memory_store"][0]
    beneath = [s for s in spans if s.trace_id == store.trace_id and s.span_id != store.span_id]
    assert "haystack.pipeline.run" in {s.name for s in beneath}, sorted({s.name for s in beneath})
    assert "haystack.component.run" in {s.name for s in beneath}
    exported = b"".join(receiver.bodies)
    for secret in (FACT, f"Quokka{RUN}", f"quokka{RUN}", QUERY, token, issued["token_id"], ASSIGNMENT, ORG):
        assert secret.encode() not in exported, secret


def test_metrics_port_must_differ_from_the_mcp_port(tmp_path: Path, pg_conn_str: str) -> None:
    port = free_port()
    config = new_schema_config(pg_conn_str)
    done = subprocess.run(
        [*OSA_MEMORY, "serve", "--port", str(port), "--metrics-port", str(port)],
        env=env_for(config, pg_conn_str),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "--metrics-port" in done.stderr


def total(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_a_killed_worker_keeps_its_counts_and_leaves_the_gauges(metrics_server: MetricsServer) -> None:
    assert metrics_server.proc is not None
    workers = serve_workers(metrics_server.proc.pid)
    if metrics_server.workers == 1:
        assert workers == []  # one process: `serve` itself answers and counts; there is no worker to kill
        return
    assert len(workers) == metrics_server.workers
    victim = workers[0]
    # A forked worker's /proc environ is the one `serve` was started with, without the folder it exported:
    # the folder is where the worker's metric files are mapped.
    mapped = [Path(m.path) for m in victim.memory_maps() if m.path.endswith(f"_{victim.pid}.db")]
    assert mapped, "the worker maps no metric file of its own"
    folder = mapped[0].parent
    assert list(folder.glob(f"gauge_live*_{victim.pid}.db"))  # its pool gauges count while it runs
    calls = total(metrics_server.scrape(), "osa_memory_tool_duration_seconds_count")

    victim.kill()  # no atexit: only the endpoint can notice
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # dead once a zombie: the supervisor reaps it in its own time
        with suppress(psutil.NoSuchProcess):
            if victim.status() != psutil.STATUS_ZOMBIE:
                time.sleep(0.05)
                continue
        break
    after = metrics_server.scrape()
    assert not list(folder.glob(f"gauge_live*_{victim.pid}.db"))
    assert list(folder.glob(f"*_{victim.pid}.db"))  # its counters and histograms stay
    assert total(after, "osa_memory_tool_duration_seconds_count") == calls  # nothing lost, nothing doubled
