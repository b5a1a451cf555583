"""Run the verification set against a server and judge it (verify/items.py makes the set and its judges).

The rule compares right or wrong per item, never the text: SGLang is not batch-invariant, so a batch of 32 may word an
answer differently from batch 1 and still be right, and a judge accepts every wording of the right answer
(items.SAME_ANSWER). What the gate must catch is a kernel fault: it is shape-dependent and corrupts a shape's answers
wholesale (one batch size's, one context length's, every tool call), while a correct model may slip on an item. So:

- A reply cut by its token bound (finish_reason `length`) and not right is asked again once with LENGTH_FACTOR times
  the bound (arithmetic 16 -> 64 tokens: working shown before the number; reasoning 2,048 -> 8,192: about 3.4 min at
  40 tokens/s, under the gate's 600 s request timeout). An HTTP error or timeout is asked again, up to
  TRANSPORT_ATTEMPTS asks in all, TRANSPORT_PAUSE apart. What is still cut or unanswered then is `inconclusive`: not
  right, so it counts against its group like a miss, but named apart from the wrong ones (budget or transport
  trouble, not a wrong answer).
- Each group (a kind at a batch size) may miss floor(TOLERANCE[kind] x its size) items, for the reason given there.
- A run that fails is run once more (`settled`): the start is judged by the second run, so that a transient fault
  (a dropped connection, a batch composed differently) never fails a start alone. Greedy answers repeat, so a right
  model's wording cannot be cured by the rerun: that is the judges' part.
- A reply that ends in a run of one repeated token is degenerate and never right, whatever came before the run: NaN
  decode logits leave the first token right (it is sampled from the prefill's logits) and every later greedy step the
  same argmax, so `Paris!!!!!!...` is no right answer.
- The verdict: `passed`; `degenerate` when every item's reply is empty, one token repeated or ends in such a run (what
  NaN decode logits give: the attention backend's fault, not an item's); `wrong` when a group fails on its wrong
  answers alone; else `inconclusive` (a group fails only with its inconclusive items counted).
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from verify import items as item_set

LENGTH_FACTOR = 4
# A reply that ends in RUN_REPEATS or more copies of one piece of text up to RUN_UNIT characters long (a token, its
# spaces kept) ends in a run of one repeated token: NaN decode logits run one to the token bound (16 at the least,
# the first token from the prefill), and no answer of the set ends in 8 copies of anything.
RUN_REPEATS, RUN_UNIT = 8, 16
RUN_NAMED = "degenerate: it ends in a run of one repeated token"
TRANSPORT_ATTEMPTS = 3
TRANSPORT_PAUSE = 5.0  # seconds between the asks of an item that got an HTTP error or timed out
# The share of a group's items that may miss (rounded down), per kind, and why.
TOLERANCE: dict[str, tuple[float, str]] = {
    "fact": (0.25, "a fault corrupts every short answer of a shape; a right model may name one capital oddly"),
    "arithmetic": (0.25, "a fault at a batch size corrupts that batch's answers wholesale; a right model with "
                         "thinking off may slip on one mental sum in four"),
    "retrieval": (0.0, "each item is the only one at its context length, and a fault past a length (the DSA "
                       "indexer's top-2,048 selection) may show at the longest alone; the planted code is copied, "
                       "not worked out"),
    "json": (0.0, "SGLang's grammar decides the form and the values are copied from the prompt; a fault in the "
                  "structured path breaks every answer"),
    "tool": (0.0, "the arguments are copied from the prompt under the tool's grammar; a mangled call is a fault"),
    "reasoning": (0.0, "one item, with thinking on and the token bound raised on a cut: a right model gets it"),
}  # fmt: skip


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
    outcome: str = (
        "right"  # right, wrong, or inconclusive (cut at the raised bound, or no answer after the retries)
    )
    attempts: int = 1  # asks sent for this item
    max_tokens: int = 0  # the token bound of the last ask
    degenerate: bool = False  # the reply as NaN decode logits leave it (`degenerate`)


@dataclass
class Reply:
    message: dict[str, Any]  # content, reasoning_content, tool_calls
    prompt_tokens: int | None
    finish_reason: str | None


Ask = Callable[[dict[str, Any]], Reply]  # a chat completion request (the openai client's create() arguments)


class Abandoned(Exception):
    """Raised by an Ask whose server is gone for good (the gate's: the start being verified ended): the run stops,
    nothing is judged. Never transport trouble to retry."""


def openai_asker(client: Any) -> Ask:
    """An Ask over the openai client's chat completions."""

    def ask(request: dict[str, Any]) -> Reply:
        reply = client.chat.completions.create(**request)
        message = reply.choices[0].message.model_dump()
        extra = getattr(reply.choices[0].message, "model_extra", None) or {}
        message.setdefault("reasoning_content", extra.get("reasoning_content"))
        tokens = reply.usage.prompt_tokens if reply.usage else None
        return Reply(message, tokens, reply.choices[0].finish_reason)

    return ask


def http_asker(base_url: str, api_key: str | None, timeout: float) -> Ask:
    """An Ask over plain HTTP (the container's own gate: no client library in the probe's path), the request as the
    openai client sends it (extra_body merged into the body)."""

    def ask(request: dict[str, Any]) -> Reply:
        body = {k: v for k, v in request.items() if k != "extra_body"} | request.get("extra_body", {})
        headers = {"Content-Type": "application/json"} | (
            {"Authorization": f"Bearer {api_key}"} if api_key else {}
        )
        sent = urllib.request.Request(
            f"{base_url}/v1/chat/completions", json.dumps(body).encode(), headers, method="POST"
        )
        with urllib.request.urlopen(sent, timeout=timeout) as response:
            reply = json.loads(response.read())
        choice = reply["choices"][0]
        return Reply(
            choice["message"], (reply.get("usage") or {}).get("prompt_tokens"), choice.get("finish_reason")
        )

    return ask


def refusal(err: BaseException) -> int | None:
    """The HTTP status of a request the server refused for what it is (a 4xx: a wrong key, a body it will not take),
    which every ask gets again; None for what may pass (a timeout, a dropped connection, 408, 429, a 5xx). Both
    clients' errors: urllib's HTTPError (`code`), the openai client's APIStatusError (`status_code`)."""
    status = getattr(err, "status_code", None) or getattr(err, "code", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return status
    return None


def asked(ask: Ask, request: dict[str, Any], pause: float) -> tuple[Reply | None, int, str]:
    """The reply, asked up to TRANSPORT_ATTEMPTS times while the ask raises (a timeout, a dropped connection, an
    HTTP error that may pass), once when the server refuses the request (refusal); how many asks; the last error
    (None reply: every ask raised)."""
    error = ""
    for attempt in range(1, TRANSPORT_ATTEMPTS + 1):
        try:
            return ask(request), attempt, ""
        except Abandoned:
            raise
        except Exception as err:  # noqa: BLE001 (any failure to get a reply is transport trouble, named)
            error = f"{type(err).__name__}: {str(err)[:160]}"
            status = refusal(err)
            if status is not None:
                return None, attempt, f"refused with HTTP {status}, not asked again: {error}"
        if attempt < TRANSPORT_ATTEMPTS:
            time.sleep(pause)
    return None, TRANSPORT_ATTEMPTS, error


def judged(item: item_set.Item, reply: Reply) -> tuple[bool, str]:
    try:
        right, received = item.judge(reply.message)
    except (KeyError, TypeError, AttributeError, ValueError) as err:  # a reply the judge cannot read: wrong
        return False, f"unreadable reply ({type(err).__name__}: {err}): {str(reply.message)[:80]}"
    if right and degenerate(reply.message):
        return False, f"{received} ({RUN_NAMED})"
    if right and item.min_prompt_tokens and reply.prompt_tokens is not None:
        if reply.prompt_tokens < item.min_prompt_tokens:
            return (
                False,
                f"{received} (only {reply.prompt_tokens} prompt tokens: the item did not cross its length)",
            )
    return right, received


def degenerate(message: dict[str, Any]) -> bool:
    """A reply as NaN decode logits leave it: nothing at all, one token over and over (the same argmax at every
    greedy step), in its reply and its reasoning alike, or a reply that ends in a run of one token (its first token,
    from the prefill, right); a tool call is never degenerate."""
    if message.get("tool_calls"):
        return False
    content, thought = (str(message.get(k) or "") for k in ("content", "reasoning_content"))
    text = f"{content} {thought}".strip()
    words = text.split()
    if not words or (len(words) >= 4 and len(set(words)) == 1) or (len(text) >= 8 and len(set(text)) == 1):
        return True
    return ends_in_run(content if content.strip() else thought)  # the reply's end: a thought is decoded first


def ends_in_run(text: str) -> bool:
    """TEXT ends in RUN_REPEATS copies of one piece of it, up to RUN_UNIT characters long."""
    return any(
        len(text) >= size * RUN_REPEATS and text.endswith(text[-size:] * RUN_REPEATS)
        for size in range(1, RUN_UNIT + 1)
    )


def one(ask: Ask, model: str, item: item_set.Item, pause: float = TRANSPORT_PAUSE) -> Result:
    """An item asked and judged: again with LENGTH_FACTOR x its bound once when cut and not right, each ask
    repeated on transport errors."""
    began, budget, attempts, raised = time.monotonic(), item.max_tokens, 0, False
    while True:
        reply, count, error = asked(ask, item.request(model, budget), pause)
        attempts += count
        if reply is None:
            outcome, right, received, tokens = (
                "inconclusive",
                False,
                f"no reply after {count} asks: {error}",
                None,
            )
            break
        right, received = judged(item, reply)
        tokens = reply.prompt_tokens
        cut = reply.finish_reason == "length" and not right
        if cut and not raised:
            budget, raised = budget * LENGTH_FACTOR, True
            continue
        outcome = "right" if right else "inconclusive" if cut else "wrong"
        if cut:
            received = f"{received} (cut at max_tokens {budget}, after a cut at {item.max_tokens})"
        break
    return Result(item.id, item.kind, item.batch, len(item.prompt), tokens, str(item.expected), received, right,
                  round(time.monotonic() - began, 3), outcome, attempts, budget,
                  reply is not None and not right and degenerate(reply.message))  # fmt: skip


def run(
    ask: Ask, model: str, items: list[item_set.Item] | None = None, pause: float = TRANSPORT_PAUSE
) -> list[Result]:
    """Every item: those of a batch size above 1 sent together, the rest one after another."""
    items = item_set.generate() if items is None else items
    results: list[Result] = []
    batches: dict[int, list[item_set.Item]] = {}
    for item in items:
        batches.setdefault(item.batch, []).append(item)
    for size, group in batches.items():
        if size == 1:
            results += [one(ask, model, item, pause) for item in group]
            continue
        with ThreadPoolExecutor(max_workers=size) as pool:
            results += list(pool.map(lambda item: one(ask, model, item, pause), group))
    return results


def allowed_misses(kind: str, size: int) -> int:
    return math.floor(TOLERANCE.get(kind, (0.0, ""))[0] * size + 1e-9)


def failing_groups(results: list[Result]) -> list[tuple[str, int, list[Result], bool]]:
    """Each group over its tolerance: kind, batch, its rows, and whether its wrong answers alone put it over."""
    groups: dict[tuple[str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.kind, r.batch), []).append(r)
    out = []
    for (kind, batch), group in sorted(groups.items()):
        allowed = allowed_misses(kind, len(group))
        misses = [r for r in group if not r.right]
        if len(misses) > allowed:
            out.append((kind, batch, group, sum(r.outcome == "wrong" for r in misses) > allowed))
    return out


def reason(kind: str, batch: int, group: list[Result]) -> str:
    wrong = [r.id for r in group if r.outcome == "wrong"]
    unsure = [r.id for r in group if r.outcome == "inconclusive"]
    if allowed_misses(kind, len(group)) == 0:
        parts = ([f"wrong {', '.join(wrong)}"] if wrong else []) + (
            [f"inconclusive {', '.join(unsure)}"] if unsure else []
        )
        return f"{kind}: {'; '.join(parts)}"
    right = sum(r.right for r in group)
    named = ([f"wrong: {', '.join(wrong[:6])}"] if wrong else []) + (
        [f"inconclusive: {', '.join(unsure[:6])}"] if unsure else []
    )
    return f"{kind} at batch {batch}: {right}/{len(group)} right ({'; '.join(named)})"


def verdict(results: list[Result]) -> tuple[bool, list[str]]:
    """Whether the run passes, and each reason it does not."""
    failing = failing_groups(results)
    return not failing, [reason(kind, batch, group) for kind, batch, group, _wrong in failing]


def outcome(results: list[Result]) -> str:
    """passed; degenerate (every answer empty, one token repeated or ending in a run of one: what NaN decode logits
    give, common/report.py FAILURES `degenerate_answers`); wrong (a group fails on its wrong answers alone); inconclusive (only with
    inconclusive items)."""
    failing = failing_groups(results)
    if not failing:
        return "passed"
    if all(r.degenerate for r in results):
        return "degenerate"
    return "wrong" if any(wrong for *_rest, wrong in failing) else "inconclusive"


def summary(results: list[Result]) -> dict[str, Any]:
    passed, reasons = verdict(results)
    right = sum(r.right for r in results)
    return {
        "passed": passed,
        "verdict": outcome(results),
        "accuracy": round(right / len(results), 4) if results else 0.0,
        "right": right,
        "items": len(results),
        "reasons": reasons,
        "inconclusive": [r.id for r in results if r.outcome == "inconclusive"],
        "seconds": round(sum(r.seconds for r in results if r.batch == 1)
                         + sum(max((r.seconds for r in results if r.batch == b), default=0)
                               for b in {r.batch for r in results} - {1}), 3),
        "results": [asdict(r) for r in results],
    }  # fmt: skip


def settled(
    ask: Ask, model: str, items: list[item_set.Item] | None = None, pause: float = TRANSPORT_PAUSE
) -> dict[str, Any]:
    """The summary of a run, or, when it fails, of a second whole run (the one that judges the start), with the
    first's verdict and reasons under `first_run`; `runs` says how many."""
    first = summary(run(ask, model, items, pause))
    if first["passed"]:
        return first | {"runs": 1, "first_run": None}
    second = summary(run(ask, model, items, pause))
    kept = {k: first[k] for k in ("verdict", "right", "items", "reasons", "inconclusive", "seconds")}
    return second | {"runs": 2, "first_run": kept}
