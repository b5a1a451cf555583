"""The verification set: items made by code from a seed, each with an answer a check can decide, none stored.

Where SM120 NVFP4 serving goes wrong, the server stays healthy and answers wrongly: FP4 GEMMs that return zeros or
garbage for some shapes (so one batch size's CUDA graph is wrong while batch 1 is right), garbled output past some
context length, mangled tool calls. So the set covers each: short factual and multi-step arithmetic answers, alone
and in concurrent batches of several sizes (equal, bounded lengths sent together, so the server runs them as one
batch of that size, on that size's graph); retrieval of a fact planted deep in long contexts, from under 2,048 tokens
(where DeepSeek Sparse Attention keeps every token) to 32k (where the indexer's top-2,048 selection decides what the
model sees); a JSON answer checked against its schema and values; a tool call checked for its name and exact
arguments; a reasoning answer in `reasoning_content` plus the content. Greedy, with thinking off where an item does
not test it (a reasoning model would otherwise spend its token bound thinking and answer nothing).

Stdlib only: the container's own start and ci/smoke both run it.
"""

from __future__ import annotations

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
NUMBER = re.compile(r"-?\d+")


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

    def request(self, model: str) -> dict[str, Any]:
        """The chat completion's arguments (the openai client's create())."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": self.prompt}],
            "temperature": 0,
            "max_tokens": self.max_tokens,
            "extra_body": {"chat_template_kwargs": {"enable_thinking": self.thinking}},
        }
        if self.tools:
            body["tools"] = self.tools
        return body

    def judge(self, message: dict[str, Any]) -> tuple[bool, str]:
        """Right or wrong, and what was received, from the reply's message (content, reasoning_content,
        tool_calls as the OpenAI API gives them)."""
        content = (message.get("content") or "").strip()
        if self.kind == "tool":
            calls = message.get("tool_calls") or []
            if not calls:
                return False, f"no tool call; content {content[:80]!r}"
            fn = calls[0]["function"]
            try:
                arguments = json.loads(fn["arguments"])
            except ValueError:
                return False, f"{fn['name']}({fn['arguments'][:80]}): not JSON"
            received = f"{fn['name']}({json.dumps(arguments, sort_keys=True)})"
            return (fn["name"], arguments) == tuple(self.expected), received
        if self.kind == "json":
            text = content.removeprefix("```json").removeprefix("```").removesuffix("```").strip()
            try:
                value = json.loads(text)
            except ValueError:
                return False, f"not JSON: {content[:80]!r}"
            return value == self.expected, json.dumps(value, sort_keys=True)[:120]
        if self.kind == "arithmetic":
            numbers = NUMBER.findall(content.replace(",", ""))
            return bool(numbers) and int(numbers[-1]) == self.expected, content[:80]
        if self.kind == "reasoning":
            thought = (message.get("reasoning_content") or "").strip()
            right = bool(thought) and self.expected in content.replace(" ", "").lower()
            return right, f"{content[:60]!r} after {len(thought)} characters of reasoning"
        return self.expected.lower() in content.lower(), content[:80]  # fact, retrieval


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


def retrieval(rng: random.Random, tokens: int) -> Item:
    name = rng.choice(("Ada", "Brook", "Cyril", "Dora", "Emil", "Freya"))
    code = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
    lines = filler(rng, tokens * CHARS_PER_TOKEN)
    lines.insert(
        int(len(lines) * 0.3), f"The secret code for {name} is {code}."
    )  # deep: far from the question
    prompt = " ".join(lines) + f"\n\nWhat is the secret code for {name}? Answer with the code only."
    return Item(f"retrieval-{tokens}", "retrieval", prompt, code, max_tokens=16, min_prompt_tokens=tokens)


def generate(seed: int = SEED) -> list[Item]:
    """The whole set, in the order run: batch 1 first, then each larger batch, then the long and structured items."""
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
    items += [retrieval(rng, tokens) for tokens in RETRIEVAL_TOKENS]
    for i in range(2):
        a, b = rng.randint(100, 999), rng.randint(2, 30)
        prompt = (
            f'Return only a JSON object with the integer keys "sum" and "product" for the numbers {a} and {b}, '
            "no other text."
        )
        items.append(Item(f"json-{i}", "json", prompt, {"sum": a + b, "product": a * b}, max_tokens=48))
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
    expected = f"{total // 60}:{total % 60:02d}pm"
    prompt = (
        f"A train leaves at {hour}:{minutes:02d} pm and travels {span_h} hours {span_m} minutes. At what time does it "
        "arrive? Answer like 5:45 pm."
    )
    items.append(Item("reasoning-train", "reasoning", prompt, expected, thinking=True, max_tokens=2048))
    return items
