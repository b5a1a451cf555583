"""The verification set and its rule (verify/), judged in-process; tests/test_smoke.py runs it through ci/smoke against
the server double and each of its wrong modes."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from conftest import ROOT
from healthcheck import phase
from verify import gate, items, run


def right_answer(item: items.Item) -> dict[str, Any]:
    """The message a correct server would send for ITEM (from the item's expectation: this tests the judge)."""
    if item.kind == "tool":
        name, arguments = item.expected
        return {
            "content": None,
            "tool_calls": [{"function": {"name": name, "arguments": json.dumps(arguments)}}],
        }
    if item.kind == "json":
        return {"content": json.dumps(item.expected)}
    if item.kind == "reasoning":
        return {"content": f"It arrives at {item.expected[:-2]} pm.", "reasoning_content": "2 h 45 after ..."}
    return {"content": f"The answer is {item.expected}."}


def asker(wrong: set[str] = frozenset(), tokens: int | None = None) -> run.Ask:  # type: ignore[assignment]
    by_prompt = {i.prompt: i for i in items.generate()}

    def ask(request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        item = by_prompt[request["messages"][0]["content"]]
        message = {"content": "zq!! 0x0"} if item.id in wrong else right_answer(item)
        return message, tokens if tokens is not None else len(item.prompt) // 4

    return ask


def test_the_set_is_generated_the_same_each_time_and_covers_each_failure() -> None:
    first, second = items.generate(), items.generate()
    assert first == second and len({i.id for i in first}) == len(first)
    kinds = Counter((i.kind, i.batch) for i in first)
    assert kinds[("arithmetic", 8)] == 8 and kinds[("arithmetic", 32)] == 32 and kinds[("arithmetic", 1)] == 4
    retrieval = [i for i in first if i.kind == "retrieval"]
    assert (
        min(i.min_prompt_tokens for i in retrieval)
        < 2048
        <= 32_000
        <= max(i.min_prompt_tokens for i in retrieval)
    )
    for (
        item
    ) in retrieval:  # sized for at least its tokens at five characters a token, the planted fact deep in it
        assert len(item.prompt) >= item.min_prompt_tokens * items.CHARS_PER_TOKEN
        assert item.prompt.index(f"is {item.expected}.") < 0.5 * len(item.prompt)
    assert {i.kind for i in first} == {"fact", "arithmetic", "retrieval", "json", "tool", "reasoning"}
    assert all(not i.thinking for i in first if i.kind != "reasoning")  # no answer lost to thinking


def test_a_correct_server_passes_and_each_kind_of_fault_fails_with_its_items_named() -> None:
    assert run.verdict(run.run(asker(), "glm-5"))[0]
    one_slip = run.verdict(run.run(asker({"arithmetic-b8-3"}), "glm-5"))
    assert one_slip == (True, [])  # 7/8: a model's slip, not a broken batch size
    batch = {f"arithmetic-b32-{i}" for i in range(32)}
    passed, reasons = run.verdict(run.run(asker(batch), "glm-5"))
    assert not passed and reasons == ["arithmetic at batch 32: 0/32 right (wrong: " + ", ".join(
        f"arithmetic-b32-{i}" for i in range(6)) + ")"]  # fmt: skip
    passed, reasons = run.verdict(run.run(asker({"retrieval-32000"}), "glm-5"))
    assert not passed and reasons == ["retrieval: wrong retrieval-32000"]
    passed, reasons = run.verdict(run.run(asker({"tool-madrid"}), "glm-5"))
    assert not passed and "tool: wrong tool-madrid" in reasons


def test_a_long_item_that_did_not_reach_its_length_is_not_counted_right() -> None:
    results = run.run(asker(tokens=1000), "glm-5")
    short = [r for r in results if r.kind == "retrieval" and r.id != "retrieval-1500"]
    assert short and all(not r.right and "did not cross its length" in r.received for r in short)


def test_the_judge_reads_tool_calls_json_and_reasoning_strictly() -> None:
    (tool,) = [i for i in items.generate() if i.id == "tool-madrid"]
    mangled = {"tool_calls": [{"function": {"name": "get_weather", "arguments": '{"location": "Madrid",'}}]}
    assert tool.judge(mangled) == (False, 'get_weather({"location": "Madrid",): not JSON')
    other = {
        "tool_calls": [
            {"function": {"name": "get_weather", "arguments": '{"location": "Madrid", "unit": "kelvin"}'}}
        ]
    }
    assert not tool.judge(other)[0]
    (reasoning,) = [i for i in items.generate() if i.kind == "reasoning"]
    assert not reasoning.judge({"content": f"{reasoning.expected[:-2]} pm"})[0]  # no reasoning_content: wrong
    summary = run.summary(run.run(asker(), "glm-5"))
    assert (
        summary["passed"] and summary["accuracy"] == 1.0 and len(summary["results"]) == summary["items"] == 57
    )


READY = {"phase": "ready", "start": 3, "http": 200, "reason": None}


def record(start: int, wrong: set[str] = frozenset(), build: str = "a" * 16) -> dict[str, Any]:  # type: ignore[assignment]
    found = run.summary(run.run(asker(wrong), "glm-5"))
    return found | {"start": start, "build_id": build, "regressed": [], "compared_with": None}


def test_the_gate_holds_a_ready_start_at_verifying_until_its_own_verification() -> None:
    assert phase.gated(READY, "enforce", None)["phase"] == "verifying"
    assert (
        phase.gated(READY, "enforce", record(2))["phase"] == "verifying"
    )  # an earlier start's is not this one's
    assert phase.gated(READY, "enforce", record(3))["phase"] == "ready"
    assert phase.gated(READY, "off", None)["phase"] == "ready"
    assert phase.gated(READY | {"http": 503}, "enforce", None)["phase"] == "ready"  # /health decides first
    assert phase.gated(READY | {"phase": "capturing"}, "enforce", None)["phase"] == "capturing"


def test_a_wrong_verification_fails_the_start_with_enforce_and_is_only_reported_with_report() -> None:
    wrong = record(3, {"tool-madrid"})
    failed = phase.gated(READY, "enforce", wrong)
    assert (
        failed["phase"] == "failed" and failed["failure_kind"] == "wrong_answers" and failed["hung"] is False
    )
    assert "tool: wrong tool-madrid" in failed["reason"] and failed["verification"]["wrong"] == [
        "tool-madrid"
    ]
    reported = phase.gated(READY, "report", wrong)
    assert reported["phase"] == "ready" and "verification FAILED, serving anyway" in reported["reason"]


def test_regressions_are_items_right_on_the_earlier_build_and_wrong_now(tmp_path: Path) -> None:
    for build, wrong, passed in (
        ("old", set(), True),
        ("older", {"fact-japan"}, True),
        ("bad", set(), False),
    ):
        (tmp_path / f"build-{build}").mkdir()
        body = record(1, wrong, build) | {"passed": passed}
        (tmp_path / f"build-{build}" / gate.RECORD).write_text(json.dumps(body))
    os.utime(tmp_path / "build-older" / gate.RECORD, (1, 1))  # the oldest
    earlier = gate.earlier_build(tmp_path, "new")
    assert earlier is not None and earlier["build_id"] == "old"  # the newest passed one, never a failed one
    assert gate.earlier_build(tmp_path, "old")["build_id"] == "older"  # type: ignore[index]
    now = record(1, {"fact-japan", "json-0"})["results"]
    assert gate.regressions(now, earlier["results"]) == ["fact-japan", "json-0"]
    assert gate.regressions(now, gate.earlier_build(tmp_path, "old")["results"]) == ["json-0"]  # type: ignore[index]


def test_the_readmes_describe_the_set_that_is_generated() -> None:
    """The README said facts were batched and verify/README.md said one tool call: four facts alone, two tools."""
    found = items.generate()
    by = {(i.kind, i.batch): 0 for i in found}
    for i in found:
        by[i.kind, i.batch] += 1
    assert by == {
        ("fact", 1): 4, ("arithmetic", 1): 4, ("arithmetic", 8): 8, ("arithmetic", 32): 32,
        ("retrieval", 1): 4, ("json", 1): 2, ("tool", 1): 2, ("reasoning", 1): 1,
    }  # fmt: skip
    said = "four facts and four sums alone, sums in batches of 8 and 32"
    for readme in (ROOT / "README.md", ROOT / "verify" / "README.md"):
        text = " ".join(readme.read_text().split())
        assert "two JSON answers, two tool calls, a reasoning answer" in text, readme
        assert said.replace("four facts", "four short facts") in text or said in text, readme
    assert f"{len(found)} items made from a fixed seed" in " ".join((ROOT / "README.md").read_text().split())
