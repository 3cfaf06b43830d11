"""A fake OpenAI-compatible chat server on 127.0.0.1 (FakeOpenAI; FakeEmbeddings below serves
/v1/embeddings): the test double of the LLM tests and the
fixed-latency LLM of the indexing benchmark. Never a production component.

Answers are scripted by input, never by the prompt's layout (workers/models/prompts.py may
change it freely). Each POST /v1/chat/completions is answered by the first of:
1. the next scripted step, if `script` is not empty: a dict {"status": 429} (or any HTTP
   error), {"delay": seconds} (then the rest of this list answers), {"content": "..."} (a 200
   answer), or an answer;
2. `schema_answers[name]`, where name is the request's structured-output schema
   (`response_format.json_schema.name`: "extraction", "resolution", "answer");
3. `answers[snippet]` for the longest snippet that occurs in the content of one of the
   request's messages (a chunk's text, a fact id), so a text contained in another is no
   mistake;
4. `default`, else HTTP 500 "script exhausted".
An answer is the content string, or a callable(request body) → content. Every request body is
recorded in `requests`, and the snippet that answered it (None: another way) in
`answered_by`."""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Mapping, Union

Answer = Union[str, Callable[[dict], str]]


class _FakeServer:
    """What both fakes share: a threaded HTTP server on 127.0.0.1 (a context manager), requests
    in flight counted (`in_flight`, `max_in_flight`, `busy_s`: request-seconds answered, so over a
    span busy_s / span is the average in flight), every POST answered with JSON by `_respond`.
    A request stops counting as its answer is sent: its client may send the next one as soon as
    it has read it, before the handler's thread ends (on a loaded machine a client bounded to two
    calls in flight was seen as three when it counted until then)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.busy_s = 0.0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._server.request_queue_size = 128  # a burst of concurrent clients is not refused
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def calls(self) -> int:
        return len(self.requests)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _respond(self, path: str, body: dict) -> tuple[int, dict]:
        raise NotImplementedError

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                with fake._lock:
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                started, answered = time.monotonic(), False

                def answer() -> None:  # once: before the answer leaves, so its client's next request counts after it
                    nonlocal answered
                    if not answered:
                        answered = True
                        with fake._lock:
                            fake.in_flight -= 1
                            fake.busy_s += time.monotonic() - started

                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                    status, payload = fake._respond(self.path, body)
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    answer()
                    self.wfile.write(data)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left
                finally:
                    answer()

        return Handler


class FakeOpenAI(_FakeServer):
    def __init__(
        self,
        default: Callable[[dict], str] | None = None,
        latency_s: float = 0.0,
        answers: Mapping[str, Answer] | None = None,
        schema_answers: Mapping[str, Answer] | None = None,
    ):
        self.script: deque = deque()
        self.default = default
        self.latency_s = latency_s
        self.answers: dict[str, Answer] = dict(answers or {})
        self.schema_answers: dict[str, Answer] = dict(schema_answers or {})
        self.answered_by: list[str | None] = []
        super().__init__()

    def _next(self, body: dict):
        """The scripted step (or None) and the answer by input (or None) for this request."""
        with self._lock:
            step = self.script.popleft() if self.script else None
            snippet, answer = self._by_input(body)
            self.requests.append(body)
            self.answered_by.append(snippet if step is None or (isinstance(step, dict) and "delay" in step) else None)
        return step, answer

    def _by_input(self, body: dict) -> tuple[str | None, Answer | None]:
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
        if schema in self.schema_answers:
            return None, self.schema_answers[schema]
        contents = [
            m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
            for m in body.get("messages") or []
        ]
        snippet = max((s for s in self.answers if any(s in c for c in contents)), key=len, default=None)
        if snippet is not None:
            return snippet, self.answers[snippet]
        return None, self.default

    def _respond(self, path: str, body: dict) -> tuple[int, dict]:
        step, answer = self._next(body)
        if isinstance(step, dict) and "delay" in step:
            time.sleep(step["delay"])
            step = None
        if self.latency_s:
            time.sleep(self.latency_s)
        if isinstance(step, dict) and "status" in step:
            return step["status"], {"error": {"message": f"scripted {step['status']}", "type": "scripted"}}
        if isinstance(step, dict) and "content" in step:
            content = step["content"]
        elif step is not None:
            content = step(body) if callable(step) else step
        elif answer is not None:
            content = answer(body) if callable(answer) else answer
        else:
            return 500, {"error": {"message": "script exhausted", "type": "scripted"}}
        return 200, {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        }


@functools.lru_cache(maxsize=100_000)  # a benchmark embeds the same names again and again: keep the fake cheap
def _fake_vector(text: str, dims: int):
    import numpy as np

    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dims).astype(np.float32)
    v /= np.linalg.norm(v)
    v.flags.writeable = False
    return v


class FakeEmbeddings(_FakeServer):
    """A fake OpenAI-compatible embeddings server on 127.0.0.1 (POST /v1/embeddings): the test
    double of the endpoint embedder and the CPU-free embedder of the indexing benchmark. Never a
    production component.

    A text's vector is deterministic (seeded by a hash of the text) and L2-normalised, of the
    request's `dimensions` when it names one, else `dims`. `latency_s` delays every answer.
    `script` steps answer the next requests first: {"status": 429} (or any HTTP error),
    {"dims": n} (a 200 answer with vectors of n columns: a misconfigured server), {"count": n}
    (a 200 answer with only n vectors), {"floats": True} (JSON floats even when base64 was asked:
    a server that ignores `encoding_format`). `refuse(text)` True: a request holding that text is
    answered 400 (as a real server refuses an input past the model's length). `.calls` counts the requests answered (errors included),
    `.texts` lists the texts embedded (200 answers), `.requests` keeps every request body."""

    def __init__(self, dims: int = 384, latency_s: float = 0.0, refuse: Callable[[str], bool] | None = None):
        self.dims = dims
        self.latency_s = latency_s
        self.refuse = refuse
        self.script: deque = deque()
        self.texts: list[str] = []
        super().__init__()

    @staticmethod
    def vector(text: str, dims: int) -> list[float]:
        """The fake's vector of `text`: the same text, the same vector, in every run."""
        return _fake_vector(text, dims).tolist()

    def _answer(self, body: dict) -> tuple[int, dict]:
        with self._lock:
            step = self.script.popleft() if self.script else {}
            self.requests.append(body)
        if "status" in step:
            return step["status"], {"error": {"message": f"scripted {step['status']}", "type": "scripted"}}
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return 400, {
                "error": {"message": "input must be a string or a list of strings", "type": "invalid_request_error"}
            }
        if self.refuse is not None and any(self.refuse(t) for t in texts):
            return 400, {
                "error": {
                    "message": "an input is longer than the model's maximum context length",
                    "type": "invalid_request_error",
                }
            }
        dims = step.get("dims") or body.get("dimensions") or self.dims
        rows = [_fake_vector(t, dims) for t in texts][: step.get("count", len(texts))]
        if body.get("encoding_format") == "base64" and not step.get("floats"):
            import base64

            rows = [base64.b64encode(r.astype("<f4").tobytes()).decode() for r in rows]
        else:
            rows = [r.tolist() for r in rows]
        with self._lock:
            self.texts.extend(texts)
        return 200, {
            "object": "list",
            "model": body.get("model", ""),
            "data": [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)],
            "usage": {
                "prompt_tokens": sum(len(t.split()) for t in texts),
                "total_tokens": sum(len(t.split()) for t in texts),
            },
        }

    def _respond(self, path: str, body: dict) -> tuple[int, dict]:
        if self.latency_s:
            time.sleep(self.latency_s)
        if not path.rstrip("/").endswith("/embeddings"):
            return 404, {"error": {"message": f"no route {path}", "type": "not_found"}}
        return self._answer(body)
