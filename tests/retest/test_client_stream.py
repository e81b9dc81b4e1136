"""The serve client counts a request as served only when its stream completes: vLLM answers 200 and reports an engine
that died mid-stream inside the stream (entrypoints/openai/completion/serving.py of 0.25.1: ``data: {error}`` then
``data: [DONE]``). Two real failing attempts of the S1 walk (incidents/h200-retest-2026-12-02-dawn/second-lease/)
had been recorded as 15/15 served with status 200."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from oomdoctor.retest import client

CHUNK = 'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" a"}]}\n\n'
ERROR = ('data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.", '
         '"type": "InternalServerError", "param": null, "code": 500}}\n\n')
BODIES = {"ok": CHUNK * 3 + "data: [DONE]\n\n", "error": CHUNK + ERROR + "data: [DONE]\n\n", "cut": CHUNK * 2}


@pytest.fixture()
def server():
    shape = {"body": "ok"}

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(BODIES[shape["body"]].encode())

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1], shape
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("body,served", [("ok", 2), ("error", 0), ("cut", 0)])
def test_only_a_completed_stream_counts_as_served(server, body, served):
    port, shape = server
    shape["body"] = body
    res = client.send(port, "/m", {"count": 2, "concurrency": 2, "prompt_tokens": 4, "max_tokens": 3})
    assert res["served"] == served
    if served:
        assert res["statuses"] == [200] and res["output_tokens"] == 6
    else:
        assert res["statuses"] == [client.STREAM_ERROR]
        assert ("EngineCore encountered an issue" in res["errors"][0]) == (body == "error")


def test_a_chunk_that_only_mentions_error_is_text():
    assert client.stream_error(json.dumps({"choices": [{"text": 'the word "error"'}]})) is None
    assert client.stream_error("not json") is None
