"""A real HTTP server on 127.0.0.1 that records the JSON POSTed to it (alert webhook tests).

``fail_first=N`` answers the first N requests with 503, as a webhook that is down would.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


class WebhookServer:
    def __init__(self, fail_first: int = 0, port: int = 0) -> None:
        self.fail_first = fail_first
        self.received: list[dict[str, Any]] = []  # every request, failed ones included
        self.accepted: list[dict[str, Any]] = []  # the ones answered 200
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.received.append(body)
                    ok = len(outer.received) > outer.fail_first
                    if ok:
                        outer.accepted.append(body)
                self.send_response(200 if ok else 503)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/s3cr3t-path"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
