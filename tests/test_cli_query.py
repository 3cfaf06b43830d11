"""`memstream query`: every field of a POST /v1/query request can be asked from the command line
(mode, as_of, retrieval params), and a bad one gets a clear error. The query worker here is a
test double that records the body it was sent and answers as the real one does (the real one's
checks of those fields: tests/test_query_bounds.py, tests/test_expiry.py)."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import Cli

ANSWER = {
    "query": "q",
    "tenant": "t",
    "mode": "reconstruct",
    "graph_version": 3,
    "timings_ms": {"total": 4.0},
    "passages": [{"id": "p1", "doc_id": "d1", "text": "Ada lives in Oslo.", "score": 0.9}],
    "facts": [],
}


@pytest.fixture
def worker():
    """A stand-in query worker on a free port: records each body; answers 400 to a 'params'
    holding 'damping' over 1, as the real one does."""
    bodies: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            bad = body.get("params", {}).get("damping", 0) > 1
            reply = {"error": "'damping' must be between 0 and 1"} if bad else {**ANSWER, "query": body["query"]}
            data = json.dumps(reply).encode()
            self.send_response(400 if bad else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    server.shutdown()


def _cli() -> Cli:
    return Cli({k: v for k, v in os.environ.items() if k != "MEMSTREAM_API_KEY"})


def test_memstream_query_sends_mode_as_of_and_params(worker):
    url, bodies = worker
    out = _cli().run(
        "query",
        "Where does Ada live?",
        "--tenant",
        "t1",
        "--mode",
        "reconstruct",
        "--as-of",
        "2026-05-01T12:00:00Z",
        "--param",
        "damping=0.7",
        "--param",
        "hub_suppression=false",
        "--param",
        "first_stage_k=20",
        "--url",
        url,
    )
    assert bodies == [
        {
            "query": "Where does Ada live?",
            "tenant": "t1",
            "top_k": bodies[0]["top_k"],
            "mode": "reconstruct",
            "answer": False,
            "as_of": "2026-05-01T12:00:00Z",
            "params": {"damping": 0.7, "hub_suppression": False, "first_stage_k": 20},
        }
    ]
    assert "1. [0.900] d1: Ada lives in Oslo." in out.stdout


def test_memstream_query_refuses_a_param_without_a_value_and_shows_the_workers_refusal(worker):
    url, bodies = worker
    bad = _cli().run("query", "q", "--param", "damping", "--url", url, check=False)
    assert bad.returncode != 0 and "--param 'damping': expected NAME=VALUE" in bad.stderr and bodies == []
    refused = _cli().run("query", "q", "--param", "damping=2", "--url", url, check=False)
    assert (
        refused.returncode == 1
        and "HTTP 400" in refused.stderr
        and "'damping' must be between 0 and 1" in refused.stderr
    )


def test_memstream_query_refuses_a_top_k_outside_one_to_a_hundred(worker):
    """--top-k 0 asked the default and exited 0 (HTTP answers 400): refused before anything is
    sent, as argparse refuses a bad choice; 1 and 100 are sent as given."""
    url, bodies = worker
    for bad in ("0", "101", "-3", "five"):
        refused = _cli().run("query", "q", "--top-k", bad, "--url", url, check=False)
        assert refused.returncode == 2 and f"--top-k: must be an integer from 1 to 100, not '{bad}'" in refused.stderr
    assert bodies == []
    for good in ("1", "100"):
        _cli().run("query", "q", "--top-k", good, "--url", url)
    assert [body["top_k"] for body in bodies] == [1, 100]


def test_memstream_query_refuses_a_url_that_is_not_one(capsys):
    """Before: `--url notaurl` and `--url "http://[::1"` ended in urllib's ValueError traceback.
    Now one line, exit 2, before anything is sent."""
    from ops import cli

    for url, why in (
        ("notaurl", "expected http://HOST:PORT"),
        ("http://[::1", "(Invalid IPv6 URL)"),
        ("http://127.0.0.1:99999", "(Port out of range"),
        ("ftp://127.0.0.1", "expected http://HOST:PORT"),
    ):
        assert cli.main(["query", "q", "--url", url]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"memstream: --url {url!r} is not a URL") and why in err and err.count("\n") == 1
