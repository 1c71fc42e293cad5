"""A scripted HTTP server on 127.0.0.1 for tests of HTTP clients (never the internet).

``with LocalServer() as server:`` serves POST requests on a free port. Per path, either queue
replies with ``server.script(path, Reply(...), ...)`` (consumed in order, the last one repeats)
(the path without its query) or install a function ``server.route(path, fn)`` that gets the ``Recorded`` request and returns a
``Reply``. Every request is recorded in ``server.requests`` (lower-cased header names, JSON body).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Union


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    """JSON data, or ``str``/``bytes`` sent as they are."""
    headers: Dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    """Seconds to wait before answering."""


@dataclass
class Recorded:
    path: str
    headers: Dict[str, str]
    body: Any
    query: str = ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        path, _, query = self.path.partition("?")
        request = Recorded(path, {k.lower(): v for k, v in self.headers.items()}, body, query)
        reply = self.server.owner._reply_for(request)
        if reply.delay:
            time.sleep(reply.delay)
        if isinstance(reply.body, bytes):
            payload, content_type = reply.body, "application/octet-stream"
        elif isinstance(reply.body, str):
            payload, content_type = reply.body.encode(), "text/html"
        else:
            payload, content_type = json.dumps(reply.body).encode(), "application/json"
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.headers.get("Content-Type", content_type))
            for name, value in reply.headers.items():
                if name != "Content-Type":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the client gave up (timeout test)
            self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class LocalServer:
    def __init__(self) -> None:
        self.requests: List[Recorded] = []
        self._routes: Dict[str, Union[List[Reply], Callable[[Recorded], Reply]]] = {}
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}{path}"

    def script(self, path: str, *replies: Reply) -> None:
        self._routes[path] = list(replies)

    def route(self, path: str, function: Callable[[Recorded], Reply]) -> None:
        self._routes[path] = function

    def requests_to(self, path: str) -> List[Recorded]:
        return [request for request in self.requests if request.path == path]

    def _reply_for(self, request: Recorded) -> Reply:
        with self._lock:
            self.requests.append(request)
            route = self._routes.get(request.path)
            if isinstance(route, list):
                return route.pop(0) if len(route) > 1 else route[0]
        if route is None:
            return Reply(404, {"error": f"no route {request.path}"})
        return route(request)

    def __enter__(self) -> "LocalServer":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
