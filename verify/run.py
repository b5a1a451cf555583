"""Run the verification set against a server and judge it (verify/items.py makes the set).

The rule compares right or wrong per item, never the text: SGLang is not batch-invariant, so a batch of 32 may word an
answer differently from batch 1 and still be right. A run passes when every group (a kind at a batch size) has at
least PASS_SHARE of its items right, and every item of the kinds a correct model does not miss (retrieval, json,
tool) is right. Why the share: a kernel fault is shape-dependent and corrupts a shape's answers wholesale, while a
correct model may slip on one arithmetic item of eight; one slip passes, a broken batch size does not.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from verify import items as item_set

PASS_SHARE = 0.8
EXACT_KINDS = ("retrieval", "json", "tool")


@dataclass
class Result:
    id: str
    kind: str
    batch: int
    prompt_chars: int
    prompt_tokens: int | None
    expected: str
    received: str
    right: bool
    seconds: float


Ask = Callable[
    [dict[str, Any]], tuple[dict[str, Any], int | None]
]  # request -> (message, usage.prompt_tokens)


def openai_asker(client: Any) -> Ask:
    """An Ask over the openai client's chat completions."""

    def ask(request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        reply = client.chat.completions.create(**request)
        message = reply.choices[0].message.model_dump()
        extra = getattr(reply.choices[0].message, "model_extra", None) or {}
        message.setdefault("reasoning_content", extra.get("reasoning_content"))
        return message, reply.usage.prompt_tokens if reply.usage else None

    return ask


def http_asker(base_url: str, api_key: str | None, timeout: float) -> Ask:
    """An Ask over plain HTTP (the container's own gate: no client library in the probe's path), the request as the
    openai client sends it (extra_body merged into the body)."""

    def ask(request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        body = {k: v for k, v in request.items() if k != "extra_body"} | request.get("extra_body", {})
        headers = {"Content-Type": "application/json"} | (
            {"Authorization": f"Bearer {api_key}"} if api_key else {}
        )
        sent = urllib.request.Request(
            f"{base_url}/v1/chat/completions", json.dumps(body).encode(), headers, method="POST"
        )
        with urllib.request.urlopen(sent, timeout=timeout) as response:
            reply = json.loads(response.read())
        return reply["choices"][0]["message"], (reply.get("usage") or {}).get("prompt_tokens")

    return ask


def one(ask: Ask, model: str, item: item_set.Item) -> Result:
    began = time.monotonic()
    try:
        message, tokens = ask(item.request(model))
        right, received = item.judge(message)
    except Exception as err:  # noqa: BLE001 (an error answer is a wrong answer, named)
        tokens, right, received = None, False, f"{type(err).__name__}: {str(err)[:160]}"
    if right and item.min_prompt_tokens and tokens is not None and tokens < item.min_prompt_tokens:
        right, received = (
            False,
            f"{received} (only {tokens} prompt tokens: the item did not cross its length)",
        )
    return Result(item.id, item.kind, item.batch, len(item.prompt), tokens, str(item.expected), received, right,
                  round(time.monotonic() - began, 3))  # fmt: skip


def run(ask: Ask, model: str, items: list[item_set.Item] | None = None) -> list[Result]:
    """Every item: those of a batch size above 1 sent together, the rest one after another."""
    items = item_set.generate() if items is None else items
    results: list[Result] = []
    batches: dict[int, list[item_set.Item]] = {}
    for item in items:
        batches.setdefault(item.batch, []).append(item)
    for size, group in batches.items():
        if size == 1:
            results += [one(ask, model, item) for item in group]
            continue
        with ThreadPoolExecutor(max_workers=size) as pool:
            results += list(pool.map(lambda item: one(ask, model, item), group))
    return results


def verdict(results: list[Result]) -> tuple[bool, list[str]]:
    """Whether the run passes, and each reason it does not."""
    groups: dict[tuple[str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.kind, r.batch), []).append(r)
    reasons = []
    for (kind, batch), group in sorted(groups.items()):
        right = sum(r.right for r in group)
        wrong = [r.id for r in group if not r.right]
        if kind in EXACT_KINDS and wrong:
            reasons.append(f"{kind}: wrong {', '.join(wrong)}")
        elif right < PASS_SHARE * len(group):
            reasons.append(
                f"{kind} at batch {batch}: {right}/{len(group)} right (wrong: {', '.join(wrong[:6])})"
            )
    return not reasons, reasons


def summary(results: list[Result]) -> dict[str, Any]:
    passed, reasons = verdict(results)
    right = sum(r.right for r in results)
    return {
        "passed": passed,
        "accuracy": round(right / len(results), 4) if results else 0.0,
        "right": right,
        "items": len(results),
        "reasons": reasons,
        "seconds": round(sum(r.seconds for r in results if r.batch == 1)
                         + sum(max((r.seconds for r in results if r.batch == b), default=0)
                               for b in {r.batch for r in results} - {1}), 3),
        "results": [asdict(r) for r in results],
    }  # fmt: skip
