"""A fake OpenAI-compatible chat server on 127.0.0.1: the test double of the LLM tests and the
fixed-latency LLM of the indexing benchmark. Never a production component.

Each POST /v1/chat/completions takes the next scripted step, or asks `default` when the
script is empty. A step is a dict: {"status": 429} (or any HTTP error), {"delay": seconds}
(then the next step answers), {"content": "..."} (a 200 answer), or a callable(request
body) → content. Every request body is recorded in `requests`."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class FakeOpenAI:
    def __init__(self, default: Callable[[dict], str] | None = None, latency_s: float = 0.0):
        self.script: deque = deque()
        self.default = default
        self.latency_s = latency_s
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def calls(self) -> int:
        return len(self.requests)

    def _next(self, body: dict):
        with self._lock:
            self.requests.append(body)
            step = self.script.popleft() if self.script else None
        return step

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                with fake._lock:
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    self._answer()
                finally:
                    with fake._lock:
                        fake.in_flight -= 1

            def _answer(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                step = fake._next(body)
                if isinstance(step, dict) and "delay" in step:
                    time.sleep(step["delay"])
                    step = None
                if fake.latency_s:
                    time.sleep(fake.latency_s)
                if isinstance(step, dict) and "status" in step:
                    return self._send(step["status"], {"error": {"message": f"scripted {step['status']}", "type": "scripted"}})
                if callable(step):
                    content = step(body)
                elif isinstance(step, dict) and "content" in step:
                    content = step["content"]
                elif fake.default is not None:
                    content = fake.default(body)
                else:
                    return self._send(500, {"error": {"message": "script exhausted", "type": "scripted"}})
                self._send(200, {
                    "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", ""),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                })

            def _send(self, status: int, payload: dict):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

        return Handler


def user_text(body: dict) -> str:
    """The chunk text the extractor put in its prompt (between the markers)."""
    content = body["messages"][1]["content"]
    return content.split("<<<TEXT\n", 1)[1].rsplit("\nTEXT>>>", 1)[0]
