"""The verification set: items made by code from a seed, each with an answer a check can decide, none stored.

Where SM120 NVFP4 serving goes wrong, the server stays healthy and answers wrongly: FP4 GEMMs that return zeros or
garbage for some shapes (so one batch size's CUDA graph is wrong while batch 1 is right), garbled output past some
context length, mangled tool calls. So the set covers each: short factual and multi-step arithmetic answers, alone
and in concurrent batches of several sizes (equal, bounded lengths sent together, so the server runs them as one
batch of that size, on that size's graph); retrieval of a fact planted deep in long contexts, from under 2,048 tokens
(where DeepSeek Sparse Attention keeps every token) to 32k (where the indexer's top-2,048 selection decides what the
model sees); a JSON answer through SGLang's structured-output path (`response_format` with a JSON schema: the grammar
decides the form, the values are copied from the prompt, so the item tests that path and no mental arithmetic); a
tool call checked for its name and arguments; a reasoning answer in `reasoning_content` plus the content. Greedy,
with thinking off where an item does not test it (a reasoning model would otherwise spend its token bound thinking
and answer nothing).

A judge decides whether a reply is the right answer, never whether it is worded as expected: SAME_ANSWER says per
kind what counts as the same answer (tests/test_verify.py holds a table of right and wrong wordings for each).

Stdlib only: the container's own start and ci/smoke both run it.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

SEED = 5  # one fixed set: a result on one build compares with another's item by item
# A context length in tokens, sized in characters: filler English runs 4-5 characters a token, so 5 characters per
# token makes a prompt at least that many tokens long. The server's usage.prompt_tokens, recorded per item, proves it.
CHARS_PER_TOKEN = 5
RETRIEVAL_TOKENS = (1_500, 4_000, 16_000, 32_000)
BATCH_SIZES = (1, 8, 32)  # captured decode sizes (configuration/batch_sizes.py): 1 and 8 exactly, 32 too
CAPITALS = (
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Egypt", "Cairo"), ("Canada", "Ottawa"),
    ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"),
)  # fmt: skip
CITIES = ("Lisbon", "Madrid", "Vienna", "Prague", "Dublin", "Warsaw")
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "the city"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location", "unit"],
        },
    },
}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# A time of day: 5:15 pm, 5:15pm, 5:15 p.m., 5.15 PM, 17:15 (the last one in a reply is its answer).
TIME = re.compile(r"\b(\d{1,2})[:.](\d{2})(?:\s*([ap])\.?\s*m\b\.?)?", re.IGNORECASE)
PARCEL_SCHEMA = {
    "type": "object",
    "properties": {"parcel": {"type": "string"}, "kg": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["parcel", "kg", "city"],
    "additionalProperties": False,
}
# What counts as the same answer, per kind: what a judge accepts (and tests/test_verify.py's table checks).
SAME_ANSWER = {
    "fact": "the expected word anywhere in the content, as a word, any case ('Paris', 'The capital of France is Paris.')",
    "arithmetic": "the last number in the content equals the value (working before it, thousands commas, 133.0 and "
                  "markdown allowed: '(44 + 57) * 2 - 69 = 202 - 69 = 133')",
    "retrieval": "the planted code anywhere in the content, as a word, any case",
    "json": "the first JSON object in the content (after a preface, inside a code fence) has each expected key with the "
            "same value: strings equal ignoring case and outer spaces, numbers equal as numbers; other keys ignored",
    "tool": "a call of the expected function whose arguments are a JSON object with the expected unit (any case) and a "
            "location naming the expected city and no other of the set's ('Madrid', 'Madrid, Spain'); other keys ignored",
    "reasoning": "some reasoning_content, and the last time of day in the content is the expected one ('5:15 pm', "
                 "'5:15pm', '5:15 p.m.', '17:15'; a time with no am/pm and an hour up to 12 is read as pm, as the "
                 "question's times are)",
}  # fmt: skip


@dataclass(frozen=True)
class Item:
    id: str
    kind: str  # fact, arithmetic, retrieval, json, tool, reasoning
    prompt: str
    expected: Any
    batch: int = 1  # how many items are sent together with it (its batch's size)
    thinking: bool = False
    max_tokens: int = 64
    tools: list[dict[str, Any]] = field(default_factory=list)
    min_prompt_tokens: int = 0  # retrieval: the length it must cross
    schema: dict[str, Any] | None = None  # json: the response_format's JSON schema (structured output)

    def request(self, model: str, max_tokens: int | None = None) -> dict[str, Any]:
        """The chat completion's arguments (the openai client's create()); `max_tokens` overrides the item's bound
        (verify/run.py asks a reply cut by its bound again with a larger one)."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": self.prompt}],
            "temperature": 0,
            "max_tokens": max_tokens or self.max_tokens,
            "extra_body": {"chat_template_kwargs": {"enable_thinking": self.thinking}},
        }
        if self.tools:
            body["tools"] = self.tools
        if self.schema:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": self.schema},
            }
        return body

    def judge(self, message: dict[str, Any]) -> tuple[bool, str]:
        """Right or wrong (SAME_ANSWER: any wording of the right answer is right), and what was received, from the
        reply's message (content, reasoning_content, tool_calls as the OpenAI API gives them)."""
        content = (message.get("content") or "").strip()
        if self.kind == "tool":
            return judge_tool(message.get("tool_calls") or [], content, self.expected)
        if self.kind == "json":
            value = first_object(content)
            if value is None:
                return False, f"no JSON object: {content[:80]!r}"
            return same_values(value, self.expected), json.dumps(value, sort_keys=True)[:120]
        if self.kind == "arithmetic":
            numbers = NUMBER.findall(content.replace(",", ""))
            return bool(numbers) and float(numbers[-1]) == self.expected, content[:80]
        if self.kind == "reasoning":
            thought = (message.get("reasoning_content") or "").strip()
            right = bool(thought) and last_time(content) == last_time(self.expected)
            return right, f"{content[:60]!r} after {len(thought)} characters of reasoning"
        return as_word(self.expected, content), content[:80]  # fact, retrieval


def as_word(word: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, re.IGNORECASE) is not None


def first_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in TEXT: after a preface, inside a code fence, or the whole of it."""
    decoder = json.JSONDecoder()
    for at in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _end = decoder.raw_decode(text, at)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def same_value(got: Any, expected: Any) -> bool:
    if isinstance(expected, str):
        return isinstance(got, str) and got.strip().lower() == expected.strip().lower()
    if isinstance(expected, int) and not isinstance(expected, bool):
        return isinstance(got, int | float) and not isinstance(got, bool) and got == expected
    return bool(got == expected)


def same_values(got: dict[str, Any], expected: dict[str, Any]) -> bool:
    return all(key in got and same_value(got[key], value) for key, value in expected.items())


def judge_tool(calls: list[dict[str, Any]], content: str, expected: Any) -> tuple[bool, str]:
    """SAME_ANSWER["tool"]: the first call, its name, and its arguments' unit and location."""
    if not calls:
        return False, f"no tool call; content {content[:80]!r}"
    fn = calls[0].get("function") or {}
    name, text = fn.get("name"), fn.get("arguments") or ""
    try:
        arguments = json.loads(text)
    except ValueError:
        return False, f"{name}({text[:80]}): not JSON"
    if not isinstance(arguments, dict):
        return False, f"{name}({text[:80]}): not an object"
    received = f"{name}({json.dumps(arguments, sort_keys=True)})"
    want_name, want = expected
    location = str(arguments.get("location", ""))
    named = [city for city in CITIES if as_word(city, location)]
    right = (
        name == want_name and same_value(arguments.get("unit"), want["unit"]) and named == [want["location"]]
    )
    return right, received


def last_time(text: str) -> int | None:
    """The last time of day in TEXT, in minutes after midnight (SAME_ANSWER["reasoning"])."""
    found = TIME.findall(text)
    if not found:
        return None
    hour, minutes, half = found[-1]
    hour, minutes = int(hour), int(minutes)
    if hour > 23 or minutes > 59:
        return None
    if half.lower() == "a":
        hour %= 12
    elif hour < 12:  # pm, or no am/pm (the question's times are all pm)
        hour += 12
    return hour * 60 + minutes


def filler(rng: random.Random, chars: int) -> list[str]:
    """Sentences that say nothing a question asks about, to CHARS characters."""
    colours = ("red", "green", "blue", "grey", "white", "amber")
    things = ("lantern", "bicycle", "teapot", "ladder", "compass", "kettle", "violin", "basket")
    places = ("harbour", "library", "orchard", "station", "market", "bridge", "garden", "workshop")
    out, size = [], 0
    while size < chars:
        line = f"A {rng.choice(colours)} {rng.choice(things)} stood near the {rng.choice(places)} on day {rng.randint(1, 999)}."
        out.append(line)
        size += len(line) + 1
    return out


def arithmetic(rng: random.Random, index: int, batch: int) -> Item:
    a, b, c, d = rng.randint(12, 89), rng.randint(12, 89), rng.randint(2, 9), rng.randint(10, 99)
    prompt = f"Compute ({a} + {b}) * {c} - {d}. Answer with the number only."
    return Item(
        f"arithmetic-b{batch}-{index}", "arithmetic", prompt, (a + b) * c - d, batch=batch, max_tokens=16
    )


def spread(items: list[Item], seed: int, groups: int) -> list[Item]:
    """The batches above 1 sent `groups` times as wide: each with the items of its other groups (their own draws)."""
    if groups <= 1:
        return items
    out = []
    for item in items:
        out.append(item if item.batch == 1 else dataclasses.replace(item, batch=item.batch * groups))
    for batch in BATCH_SIZES[1:]:
        for g in range(1, groups):
            rng = random.Random(f"{seed}-group-{g}-batch-{batch}")
            for i in range(batch):
                extra = arithmetic(rng, i, batch)
                out.append(
                    dataclasses.replace(extra, id=f"arithmetic-b{batch}-g{g}-{i}", batch=batch * groups)
                )
    return out


def retrieval(rng: random.Random, tokens: int) -> Item:
    name = rng.choice(("Ada", "Brook", "Cyril", "Dora", "Emil", "Freya"))
    code = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
    lines = filler(rng, tokens * CHARS_PER_TOKEN)
    lines.insert(
        int(len(lines) * 0.3), f"The secret code for {name} is {code}."
    )  # deep: far from the question
    prompt = " ".join(lines) + f"\n\nWhat is the secret code for {name}? Answer with the code only."
    return Item(f"retrieval-{tokens}", "retrieval", prompt, code, max_tokens=16, min_prompt_tokens=tokens)


def generate(seed: int = SEED, groups: int = 1) -> list[Item]:
    """The whole set, in the order run: batch 1 first, then each larger batch, then the long and structured items.
    `groups`: the replica's attention-DP groups (GLM5_PROFILE=throughput, launch.json's attn_dp_size). SGLang's DP
    controller spreads concurrent requests over the groups (0.5.23 managers/data_parallel_controller.py: round robin
    or the fewest requests), so a batch of B reaches each group's graph of B only when B x groups are sent together:
    each larger batch gets (groups - 1) x B more items, drawn apart so that every item of one group stays as it is
    (its id compares across builds)."""
    rng = random.Random(seed)
    items = [
        Item(f"fact-{country.lower()}", "fact", f"What is the capital of {country}? Answer with one word.", capital,
             max_tokens=16)
        for country, capital in CAPITALS[:4]
    ]  # fmt: skip
    for batch in BATCH_SIZES:
        items += [
            arithmetic(rng, i, batch) for i in range(4 if batch == 1 else batch)
        ]  # batch 1: four, alone
    items = spread(items, seed, groups)
    items += [retrieval(rng, tokens) for tokens in RETRIEVAL_TOKENS]
    for i in range(2):
        # The same two draws as the set's first JSON items made, so every later item (and its id) stays as it was.
        a, kg = rng.randint(100, 999), rng.randint(2, 30)
        own = random.Random(a)
        parcel, city = (
            "".join(own.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6)),
            own.choice(CITIES),
        )
        prompt = (
            f"Parcel {parcel} weighs {kg} kg and goes to {city}. Give its parcel code, weight in kg and city as "
            'JSON with the keys "parcel", "kg" and "city".'
        )
        expected = {"parcel": parcel, "kg": kg, "city": city}
        items.append(Item(f"json-{i}", "json", prompt, expected, max_tokens=64, schema=PARCEL_SCHEMA))
    for i, city in enumerate(rng.sample(CITIES, 2)):
        unit = ("celsius", "fahrenheit")[i % 2]
        prompt = f"What is the weather in {city} right now, in {unit}? Use the tool."
        items.append(Item(f"tool-{city.lower()}", "tool", prompt, ("get_weather", {"location": city, "unit": unit}),
                          max_tokens=64, tools=[WEATHER_TOOL]))  # fmt: skip
    hour, minutes, span_h, span_m = (
        rng.randint(1, 6),
        rng.choice((0, 15, 30)),
        rng.randint(1, 3),
        rng.choice((15, 45)),
    )
    total = hour * 60 + minutes + span_h * 60 + span_m  # at most 10:15 pm: the same afternoon or evening
    arrival = f"{total // 60}:{total % 60:02d}pm"
    prompt = (
        f"A train leaves at {hour}:{minutes:02d} pm and travels {span_h} hours {span_m} minutes. At what time does it "
        "arrive? Answer like 5:45 pm."
    )
    items.append(Item("reasoning-train", "reasoning", prompt, arrival, thinking=True, max_tokens=2048))
    return items
