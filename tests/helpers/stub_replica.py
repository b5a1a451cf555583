"""A replica stand-in for the gateway's fault tests: only where no real server gives the answer on demand (a 500 to
one request, an answer slower than the gateway's timeout). Each one counts the attempts it received per request.

It imitates SGLang 0.5.23's HTTP side as the gateway meets it: `/health` 200, `/server_info` and `/model_info` as
tests/doubles/sglang_server_double.py serves them (read from srt/entrypoints/http_server.py), the bearer key on every
other route, and on `/v1/chat/completions` the body of an unexpected exception: 500 with
`{"object": "error", "message": "Internal server error: ...", "type": "InternalServerError", "param": null,
"code": 500}` (srt/entrypoints/openai/serving_base.py:136-142, create_error_response). The kit's exporter's `/ready`
(200, phase and pool, healthcheck/phase.py) is on a second port, as on a replica.

A request's last user message chooses: `answer-500 ...` gets the 500 above; `slow-SECONDS ...` is answered after
that long; anything else at once."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "glm-5"


class StubReplica:
    def __init__(self, key: str, pool_tokens: int = 412160) -> None:
        self.key, self.pool = key, pool_tokens
        # Its exporter's /ready: the phase it says (200 only for "ready", 503 otherwise, healthcheck/phase.py), or
        # silent (the connection closed with no answer: an exporter restarting, a box gone).
        self.phase, self.silent = "ready", False
        self.attempts: Counter[str] = Counter()  # request text -> times received
        self.lock = threading.Lock()
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.exporter = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        for server in (self.api, self.exporter):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.api.server_address[1])

    @property
    def exporter_port(self) -> int:
        return int(self.exporter.server_address[1])

    def stop(self) -> None:
        for server in (self.api, self.exporter):
            server.shutdown()
            server.server_close()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {stub.key}":
                    return True
                self.reply(401, {"error": "Unauthorized"})
                return False

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/ready":
                    if stub.silent:
                        self.close_connection = True
                        return
                    ready = {"phase": stub.phase, "capacity": {"max_total_num_tokens": stub.pool}}
                    self.reply(200 if stub.phase == "ready" else 503, ready)
                elif path in ("/health", "/health_generate"):
                    self.reply(200, {})
                elif not self.authorized():
                    return
                elif path in ("/server_info", "/get_server_info"):
                    self.reply(200, {"served_model_name": MODEL, "tp_size": 8, "version": "stub"})
                elif path in ("/model_info", "/get_model_info"):
                    self.reply(200, {"model_path": "/models/GLM-5-NVFP4", "is_generation": True})
                elif path == "/v1/models":
                    self.reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                else:
                    self.reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                if not self.authorized():
                    return
                text = str(body.get("messages", [{}])[-1].get("content", ""))
                with stub.lock:
                    stub.attempts[text] += 1
                if text.startswith("answer-500"):
                    time.sleep(0.2)
                    self.reply(
                        500,
                        {"object": "error", "message": "Internal server error: stub", "type": "InternalServerError",
                         "param": None, "code": 500},
                    )  # fmt: skip
                    return
                if text.startswith("slow-"):
                    time.sleep(float(text.split()[0].removeprefix("slow-")))
                self.reply(
                    200,
                    {"id": "chatcmpl-stub", "object": "chat.completion", "model": MODEL,
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
                )  # fmt: skip

            def log_message(self, *_a: Any) -> None:
                return

        return Handler
