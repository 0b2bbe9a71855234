"""A defect a review found in the host's early first call (commit 69e3329), kept as a regression test: learning
the first request runs the container's code
on the host, with a prior session that an earlier container wrote. The host must not do there what only the
container may do: here, fetch a URL. A session that passes the host's own session check (runner/sessions.py
`clean`) makes pydantic-ai download a `DocumentUrl` / `ImageUrl` on the host while building the request:
`force_download="allow-local"` is part of the serialized history and lifts pydantic-ai's SSRF guard, so a
loopback (or any private-network) service of the host is fetched and its content is put into the first call,
which the host then sends to the provider. The container itself has network `none`; the policy refuses
content the provider would fetch by reference; and here the host fetches it for the run instead.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic_ai.messages import (
    DocumentUrl,
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

from runner.first_call import FirstRequestUnknown, learn_first_request
from runner.sessions import clean
from tests.container.agent_helpers import make_task

pytestmark = pytest.mark.usefixtures("allow_model_requests")

SECRET = b"HOST-ONLY-SECRET-7f3a"


class _Service:
    """A service on the host's loopback that no container can reach: records each GET it serves."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                content_type = "image/png" if self.path.endswith(".png") else "text/plain"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(SECRET)))
                self.end_headers()
                self.wfile.write(SECRET)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> _Service:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def service() -> Iterator[_Service]:
    with _Service() as running:
        yield running


def session_from_an_earlier_run(item: DocumentUrl | ImageUrl) -> list[Any]:
    """What an earlier container uploaded as its session, as the host keeps it and hands it to the next run."""
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content=["Summarise this file.", item])]),
        ModelResponse(parts=[TextPart(content="Done.")]),
    ]
    kept: list[Any] = json.loads(clean(ModelMessagesTypeAdapter.dump_json(history), 50))
    return kept


@pytest.mark.parametrize("provider_kind", ["openai", "anthropic"])
@pytest.mark.parametrize("kind", ["document", "image"])
def test_learning_the_first_request_fetches_nothing_from_the_hosts_network(
    service: _Service, provider_kind: str, kind: str
) -> None:
    url = f"{service.base}/internal/{'secret.txt' if kind == 'document' else 'secret.png'}"
    item = (
        DocumentUrl(url=url, force_download="allow-local")
        if kind == "document"
        else ImageUrl(url=url, force_download="allow-local")
    )
    task = make_task(provider_kind=provider_kind, model="scripted-model", history=session_from_an_earlier_run(item))

    try:
        learned = learn_first_request(task)
    except FirstRequestUnknown:
        learned = None  # refusing to learn such a request is fine; fetching it is not

    assert service.hits == []
    assert learned is None or SECRET not in learned.body
