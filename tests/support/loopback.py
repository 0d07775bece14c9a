"""The lifecycle the local test servers share: a threaded HTTP server on a loopback port, started and stopped."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer


class LoopbackServer:
    """Serves `handler` on `host:port` (port 0: any free one) in a daemon thread once `start` is called."""

    def __init__(self, handler, host: str = "127.0.0.1", port: int = 0, name: str = "loopback"):
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self):
        self._thread = threading.Thread(target=self._server.serve_forever, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
