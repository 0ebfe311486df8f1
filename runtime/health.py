"""`/metrics`, `/healthz` and `/readyz` for the services that have no web framework of their own.

`/healthz` answers 200 while the process serves HTTP (the liveness probe). `/readyz`
answers 200 once every part that registered with `mark` is ready (the indexer following its
chains, a consumer joined to its group), 503 with the parts that are not otherwise, so a
broker or database outage takes a pod out of rotation without restarting it. The server runs
in a daemon thread, like prometheus-client's own.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

_READY: dict[str, bool] = {}
_LOCK = threading.Lock()


def mark(part: str, ready: bool) -> None:
    """Record whether `part` of this process is ready (first call registers it)."""
    with _LOCK:
        _READY[part] = ready


def readiness() -> tuple[bool, dict[str, bool]]:
    """(all registered parts ready and at least one registered, each part's state)."""
    with _LOCK:
        parts = dict(_READY)
    return bool(parts) and all(parts.values()), parts


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(200, b'{"status":"ok"}', "application/json")
        elif path == "/readyz":
            ok, parts = readiness()
            body = json.dumps({"status": "ready" if ok else "not ready", "parts": parts}).encode()
            self._send(200 if ok else 503, body, "application/json")
        else:
            self._send(404, b'{"error":"not found"}', "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: no access log
        return


def start_server(port: int, addr: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve `/metrics`, `/healthz` and `/readyz` on `addr:port` from a daemon thread."""
    server = ThreadingHTTPServer((addr, port), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="escrowd-health", daemon=True).start()
    return server
