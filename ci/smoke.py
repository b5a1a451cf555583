"""Boot the GLM-5 server (or use a running one), wait until it is ready, query it as users do, report.

    ci/smoke [--timeout S] [--keep]            docker compose up -d glm5, test, docker compose down
    ci/smoke --url http://HOST:30000           test a server that is already running

Checks (each named, with a clear failure message), through the official openai client: models, chat,
chat_stream, completion, tool_call, reasoning, verification (verify/: the set that catches a healthy server answering
wrongly), decode_speed; and metrics (plain HTTP: not an OpenAI route).
Reports time to ready, time to first token and single-stream decode tokens/s as a summary, as JSON
(smoke.json) and as JUnit XML (smoke.xml) in --report-dir. The URL, port and API key follow
ci/readiness.py (GLM5_HOST_PORT, GLM5_API_KEY or GLM5_API_KEY_FILE from the shell or .env, else glm5.env's key).
Exit codes (common/report.py): 0 all checks passed, 1 a check failed, 3 an invalid setting,
4 the server never became ready.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import openai

from ci import host_versions, readiness
from common.report import FAILED, INVALID_SETTING, NEVER_READY, OK, SERVER_EXISTS, Log, Problems
from configuration import settings
from verify import run as verification

ROOT = Path(__file__).resolve().parent.parent
PROG = "ci/smoke"
QUESTION = "What is the capital of France? Answer with one word."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
    },
}


class CheckFailed(Exception):
    pass


class Smoke:
    """The client, the expected model and the metrics the checks gather."""

    def __init__(self, conn: readiness.Connection, model: str, timeout: float) -> None:
        self.conn, self.model, self.metrics = conn, model, {"url": conn.url}
        self.metrics_url: str | None = None  # where /metrics is, when not at conn.url (through the gateway)
        # The client needs some key; a server without --api-key ignores it.
        self.client = openai.OpenAI(
            base_url=conn.url + "/v1", api_key=conn.api_key or "none", timeout=timeout, max_retries=0
        )

    def chat(self, **extra: Any) -> Any:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0,
            "max_tokens": 512,
        } | extra
        return self.client.chat.completions.create(**body)


def expect_paris(text: str | None, where: str) -> None:
    if not text or "paris" not in text.lower():
        raise CheckFailed(f"expected 'Paris' in {where}, got {(text or '')[:200]!r}")


def check_models(s: Smoke) -> str:
    ids = [m.id for m in s.client.models.list()]
    if s.model not in ids:
        raise CheckFailed(f"/v1/models lists {ids}, not {s.model!r} (wrong model served, or set --model)")
    return f"serves {s.model}"


def check_chat(s: Smoke) -> str:
    content = s.chat().choices[0].message.content
    if not content:
        raise CheckFailed("the chat completion has empty content")
    expect_paris(content, "the answer")
    return f"answered {content.strip()[:40]!r}"


def check_chat_stream(s: Smoke) -> str:
    began, first = time.monotonic(), None
    text, finish, chunks = "", None, 0
    for chunk in s.chat(stream=True):
        chunks += 1
        if not chunk.choices:
            continue
        piece = chunk.choices[0].delta.content or ""
        if piece and first is None:
            first = time.monotonic()
        text += piece
        finish = chunk.choices[0].finish_reason or finish
    if finish is None:
        raise CheckFailed(f"no chunk carried a finish_reason ({chunks} chunks)")
    expect_paris(text, "the streamed answer")
    if first is not None:
        s.metrics["ttft_s"] = round(first - began, 3)
    return f"{chunks} chunks, finish_reason={finish}"


def check_completion(s: Smoke) -> str:
    done = s.client.completions.create(
        model=s.model, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    text = (done.choices[0].text or "").strip() or None
    expect_paris(text, "the completion (empty text fails here too)")
    return f"completed {str(text)[:40]!r}"


def check_tool_call(s: Smoke) -> str:
    choice = s.chat(
        messages=[{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
    ).choices[0]
    calls = choice.message.tool_calls or []
    if not calls:
        raise CheckFailed(
            f"no tool_calls in the response (finish_reason={choice.finish_reason}); is --tool-call-parser glm47 set?"
        )
    fn = calls[0].function
    if fn.name != "get_weather":
        raise CheckFailed(f"called {fn.name!r}, expected get_weather")
    try:
        arguments = json.loads(fn.arguments or "")
    except ValueError as err:
        raise CheckFailed(f"tool arguments are not JSON: {fn.arguments!r}") from err
    if not isinstance(arguments, dict) or "location" not in arguments:
        raise CheckFailed(f"tool arguments lack the required 'location': {arguments!r}")
    return f"get_weather({json.dumps(arguments)})"


def check_reasoning(s: Smoke) -> str:
    message = s.chat(extra_body={"chat_template_kwargs": {"enable_thinking": True}}).choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content")
    content = message.content or ""
    if "<think>" in content or "</think>" in content:
        raise CheckFailed("thinking text is inside content: the reasoning parser (glm45) did not separate it")
    if not reasoning:
        raise CheckFailed("no reasoning_content with thinking enabled; is --reasoning-parser glm45 set?")
    expect_paris(content, "the answer after reasoning")
    return f"{len(reasoning)} characters of reasoning, then {content.strip()[:30]!r}"


def check_verification(s: Smoke) -> str:
    """The verification set (verify/): right answers alone, in batches of 8 and 32, from long contexts, as JSON, as
    a tool call and after reasoning; the per-item report goes to smoke.json."""
    # Run twice when the first run fails, as the start's own gate does.
    found = verification.settled(verification.openai_asker(s.client), s.model)
    s.metrics["verification"] = {k: v for k, v in found.items() if k != "results"}
    s.metrics["verification_items"] = found["results"]
    if not found["passed"]:
        raise CheckFailed(
            f"{found['verdict']}, {found['right']}/{found['items']} right: {'; '.join(found['reasons'])}"
        )
    return f"{found['right']}/{found['items']} right ({found['accuracy']:.0%}) in {found['seconds']} s"


def check_decode_speed(s: Smoke) -> str:
    stream = s.chat(
        messages=[{"role": "user", "content": "Count from 1 to 300, separated by spaces."}],
        max_tokens=256,
        stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    times = [time.monotonic() for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
    if len(times) < 2:
        raise CheckFailed(f"only {len(times)} content chunks streamed: cannot measure decode speed")
    s.metrics["decode_tokens_per_s"] = round((len(times) - 1) / max(times[-1] - times[0], 1e-9), 1)
    return f"{s.metrics['decode_tokens_per_s']} tokens/s over {len(times)} chunks (single stream)"


def check_metrics(s: Smoke) -> str:
    """Prometheus text, not an OpenAI route: plain HTTP, as a scraper reads it."""
    base = s.metrics_url or s.conn.url
    code = readiness.http_status(base, "/metrics")
    if code != 200:
        raise CheckFailed(
            f"{base}/metrics answered {code}; is --enable-metrics set? (through the gateway: --metrics-url)"
        )
    with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
        text = response.read().decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("sglang:")}
    if not names:
        raise CheckFailed("/metrics has no sglang: metrics")
    return f"{len(names)} sglang metrics"


CHECKS: list[tuple[str, Callable[[Smoke], str]]] = [
    ("models", check_models),
    ("chat", check_chat),
    ("chat_stream", check_chat_stream),
    ("completion", check_completion),
    ("tool_call", check_tool_call),
    ("reasoning", check_reasoning),
    ("verification", check_verification),
    ("decode_speed", check_decode_speed),
    ("metrics", check_metrics),
]


def run_checks(s: Smoke) -> list[dict[str, Any]]:
    results = []
    for name, fn in CHECKS:
        began = time.monotonic()
        try:
            message, passed = fn(s), True
        except CheckFailed as err:
            message, passed = str(err), False
        except openai.APIStatusError as err:
            message, passed = (
                f"{err.request.method} {err.request.url.path} answered {err.status_code}: {str(err)[:300]}",
                False,
            )
        except (openai.APIError, OSError, ValueError, KeyError, IndexError, TypeError) as err:
            message, passed = f"{type(err).__name__}: {err}", False
        seconds = time.monotonic() - began
        print(f"{PROG}: {'PASS' if passed else 'FAIL'} {name}: {message}", flush=True)
        results.append({"name": name, "passed": passed, "message": message, "seconds": round(seconds, 3)})
    return results


def write_reports(report_dir: Path, results: list[dict[str, Any]], metrics: dict[str, Any]) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "smoke.json").write_text(
        json.dumps({"metrics": metrics, "checks": results}, indent=2) + "\n"
    )
    failures = sum(1 for r in results if not r["passed"])
    cases = []
    for r in results:
        body = "" if r["passed"] else f'<failure message="{escape(r["message"], {chr(34): "&quot;"})}"/>'
        cases.append(
            f'  <testcase classname="glm5.smoke" name="{r["name"]}" time="{r["seconds"]:.3f}">{body}</testcase>'
        )
    xml = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="glm5-smoke" tests="{len(results)}" failures="{failures}">\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )
    (report_dir / "smoke.xml").write_text(xml)


def main() -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="test this running server instead of booting with docker compose")
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds to wait until ready (default 3600)"
    )
    parser.add_argument(
        "--model", default=None, help="served model name expected in /v1/models (default: glm5.toml's)"
    )
    parser.add_argument(
        "--api-key",
        help="bearer key (default: GLM5_API_KEY or GLM5_API_KEY_FILE, else glm5.env's GLM5_API_KEY; prefer those: argv is visible in ps)",
    )
    parser.add_argument(
        "--metrics-url",
        help="where the server's /metrics is (default: --url; through the gateway, a replica's URL)",
    )
    parser.add_argument("--request-timeout", type=float, default=300, help="seconds per request")
    parser.add_argument("--poll", type=float, default=10, help="seconds between readiness polls")
    parser.add_argument("--report-dir", type=Path, default=ROOT / "out" / "smoke")
    parser.add_argument("--keep", action="store_true", help="leave the compose service running")
    a = parser.parse_args()
    try:
        conn = readiness.connection(os.environ, a.url)
        if a.api_key:
            conn = readiness.Connection(conn.url, a.api_key)
        model = a.model or settings.resolve({})["served_model_name"]
    except Problems as err:
        return Log(PROG).problems(err.problems) or INVALID_SETTING
    target: readiness.Target = (
        readiness.Url(conn, os.environ) if a.url else readiness.Compose(conn, a.report_dir)
    )
    smoke = Smoke(conn, model, a.request_timeout)
    smoke.metrics_url = a.metrics_url.rstrip("/") if a.metrics_url else None
    a.report_dir.mkdir(parents=True, exist_ok=True)
    since = None if a.url else readiness.now()  # a running server's current start counts, whenever it began
    too_old = [] if a.url else host_versions.problems(*host_versions.read())
    for line in too_old:
        print(f"{PROG}: FAIL host: {line}", file=sys.stderr)
    if too_old:
        return FAILED
    try:
        if a.url is None:
            print(f"{PROG}: docker compose up -d glm5", flush=True)
            try:
                target.boot({})
            except readiness.ServerExists as err:
                Log(PROG).error(str(err))
                return SERVER_EXISTS
        waited = readiness.wait_until_ready(target, a.timeout, a.poll, since, readiness.say(PROG))
        if not waited.ready:
            print(
                f"{PROG}: FAIL the server never became ready: {waited.reason}\n{PROG}: state: {json.dumps(waited.state)}\n"
                f"--- last log lines ---\n{target.log_tail()}",
                file=sys.stderr,
            )
            failed = [{"name": "ready", "passed": False, "message": waited.reason, "seconds": waited.seconds}]
            write_reports(a.report_dir, failed, smoke.metrics)
            return NEVER_READY
        smoke.metrics["time_to_ready_s"] = round(waited.seconds, 1)
        smoke.metrics["doctor_warnings"] = (waited.state or {}).get("doctor_warnings", [])
        results = run_checks(smoke)
    finally:
        if a.url is None and not a.keep:
            target.stop()
    write_reports(a.report_dir, results, smoke.metrics)
    failed = [r for r in results if not r["passed"]]
    m = smoke.metrics
    print(f"{PROG}: {len(results) - len(failed)} passed, {len(failed)} failed")
    print(
        f"{PROG}: time to ready {m.get('time_to_ready_s')} s, time to first token {m.get('ttft_s')} s, "
        f"single-stream decode {m.get('decode_tokens_per_s')} tokens/s"
    )
    print(f"{PROG}: reports in {a.report_dir}/smoke.json and smoke.xml")
    return FAILED if failed else OK


if __name__ == "__main__":
    sys.exit(main())
