"""The verification set and its rule (verify/), judged in-process; tests/test_smoke.py runs it through ci/smoke against
the server double and each of its wrong modes. A right model worded otherwise passes: its raw output goes through
SGLang 0.5.23's own glm45 reasoning and glm47 tool-call parsers (tests/helpers/sglang_parser_oracle.py), as the
server would send it, to the kit's judges."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import subprocess
import time
import urllib.error
from collections import Counter
from collections.abc import Callable
from email.message import Message
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from common.report import FAILURE, WRONG_ANSWERS
from configuration import state
from conftest import ROOT, kit_env
from entrypoint import lifecycle
from healthcheck import probe
from healthcheck.verdict import Recorded, Verdict
from helpers import oracles
from helpers.judging import judged
from test_folders import FakeSupervisor, listener_values
from verify import gate, items, run

BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
PARSER_ORACLE = ROOT / "tests" / "helpers" / "sglang_parser_oracle.py"


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


def asker(wrong: set[str] = frozenset(), tokens: int | None = None, groups: int = 1) -> run.Ask:  # type: ignore[assignment]
    by_prompt = {i.prompt: i for i in items.generate(groups=groups)}

    def ask(request: dict[str, Any]) -> run.Reply:
        item = by_prompt[request["messages"][0]["content"]]
        message = {"content": "zq!! 0x0"} if item.id in wrong else right_answer(item)
        return run.Reply(message, tokens if tokens is not None else len(item.prompt) // 4, "stop")

    return ask


def the(item_id: str) -> items.Item:
    (found,) = [i for i in items.generate() if i.id == item_id]
    return found


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


def test_under_dp_attention_each_batch_is_sent_once_per_group_and_the_rest_stays() -> None:
    """GLM5_PROFILE=throughput, 4 groups: SGLang spreads concurrent requests over the groups, so the batches of 8 and
    32 go out as 32 and 128 at once (each group then runs its 8 and its 32); every item of one group is the same item
    as under TP attention (same id, same prompt), so a result compares across builds."""
    tp, dp = items.generate(), items.generate(groups=4)
    sent = Counter(i.batch for i in dp if i.kind == "arithmetic")
    assert sent == {1: 4, 32: 32, 128: 128}
    assert len({i.id for i in dp}) == len(dp)
    by_id = {i.id: i for i in dp}
    assert all(by_id[i.id].prompt == i.prompt and by_id[i.id].expected == i.expected for i in tp)
    broken = {i.id for i in dp if i.id.startswith("arithmetic-b32-")}  # every group runs the same graph of 32
    passed, reasons = run.verdict(run.run(asker(broken, groups=4), "glm-5", dp))
    assert not passed and reasons[0].startswith("arithmetic at batch 128: 0/128 right")
    assert run.verdict(run.run(asker(groups=4), "glm-5", dp)) == (True, [])


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
    assert summary["verdict"] == "passed" and summary["inconclusive"] == []


# Start #3, ready by its log (SGLang 0.5.23's lines) and /health: what the gate holds until its own verification.
READY_LOG = (
    b"===== glm5-serve: server start #3 at 2026-12-03T09:00:00+00:00 pid 7: decode graphs expected 52, prefill 58 "
    b"=====\n" + (ROOT / "tests/fixtures/logs/sglang-0.5.23-rendered-from-source.log").read_bytes()
)


def record(start: int, wrong: set[str] = frozenset(), build: str = "a" * 16) -> dict[str, Any]:  # type: ignore[assignment]
    found = run.summary(run.run(asker(wrong), "glm-5"))
    return found | {"start": start, "build_id": build, "regressed": [], "compared_with": None}


def ready(verified: dict[str, Any] | None = None, **more: Any) -> Verdict:
    """The whole judgement of start #3 with verified.json `verified` (probe.verification_of reads it)."""
    found = probe.verification_of(verified, 3)
    return judged(READY_LOG, alive=True, http=more.pop("http", 200), verification=found, **more)


def test_a_start_judged_wrong_is_recorded_by_the_listener_with_its_exit_code_under_enforce_only(
    tmp_path: Path,
) -> None:
    """The gate only verifies; the lifecycle listener's tick records the judged verdict, with the kind's exit code
    (common/report.py FAILURES), the code entrypoint.sh exits with once stopped."""
    (tmp_path / state.STARTS).write_text("3")
    wrong = record(3, {"tool-madrid"}) | {"verdict": "wrong"}
    unsure = wrong | {"verdict": "inconclusive", "reasons": ["retrieval: inconclusive retrieval-32000"]}
    env = kit_env(GLM5_STATE_DIR=str(tmp_path))
    for verified, kind, code in ((wrong, "wrong_answers", 71), (unsure, "verify_inconclusive", 72)):
        state.clear_failed(tmp_path)
        found = ready(verified)
        assert (
            lifecycle.watch(listener_values(tmp_path, 2), FakeSupervisor(), lambda found=found: found)
            == lifecycle.STOPPED
        )
        failed = json.loads((tmp_path / "failed.json").read_text())
        assert (
            (failed["start"], failed["kind"], failed["code"])
            == (3, kind, code)
            == (3, kind, FAILURE[kind].exit_code)
        )
        done = subprocess.run([str(ROOT / "entrypoint/launch"), "--failed-code"], env=env, capture_output=True,
                              text=True, check=True)  # fmt: skip
        assert done.stdout.strip() == str(code)
    assert "verification inconclusive twice" in failed["reason"]
    state.clear_failed(tmp_path)
    served = ready(wrong, verify="report")
    assert (
        served.phase == "ready"
        and lifecycle.watch(listener_values(tmp_path, 2), FakeSupervisor(), lambda: served) is None
    )
    assert not (tmp_path / "failed.json").exists()  # serving anyway: no failure


def test_the_gate_holds_a_ready_start_at_verifying_until_its_own_verification() -> None:
    assert ready().phase == "verifying"
    assert ready(record(2)).phase == "verifying"  # an earlier start's is not this one's
    assert ready(record(3)).phase == "ready"
    assert ready(verify="off").phase == "ready"
    assert ready(http=503).phase == "ready"  # /health decides first
    capturing = judged(READY_LOG.split(b"Capture target decode CUDA graph end")[0], alive=True)
    assert capturing.phase == "capturing"


def test_a_wrong_verification_fails_the_start_with_enforce_and_is_only_reported_with_report() -> None:
    wrong = record(3, {"tool-madrid"})
    failed = ready(wrong)
    assert (failed.phase, failed.failure_kind, failed.hung) == ("failed", "wrong_answers", False)
    assert failed.verification is not None and failed.verification.wrong == ("tool-madrid",)
    assert "tool: wrong tool-madrid" in str(failed.reason) and failed.failure_code == 213  # not recorded yet
    reported = ready(wrong, verify="report")
    assert reported.phase == "ready" and "verification FAILED, serving anyway" in str(reported.reason)


def test_a_recorded_wrong_start_keeps_its_kind_and_names_inconclusive_items_apart() -> None:
    """Once the listener records it (failed.json, 71), the verdict says what failed with the recorded code; an item
    with no conclusion is listed as inconclusive, not as a wrong answer."""
    found = record(3, {"tool-madrid"})
    for row in found["results"]:
        if row["id"] == "fact-japan":
            row |= {"right": False, "outcome": "inconclusive"}
    failed = Recorded("wrong_answers", WRONG_ANSWERS, "verification failed, the server answers wrongly: ...")
    verdict = ready(found, failed=failed)
    assert (verdict.phase, verdict.failure_kind, verdict.failed_code, verdict.failure_code) == (
        "failed", "wrong_answers", 71, 71,
    )  # fmt: skip
    assert verdict.verification is not None and verdict.verification.wrong == ("tool-madrid",)
    assert verdict.verification.inconclusive == ("fact-japan",)
    # A recorded failure keeps the kind its record names, whatever the log shows.
    refused = Recorded("refused", 31, "preflight: the model folder is empty")
    assert judged(b"", failed=refused).failure_kind == "refused"


def test_regressions_are_items_right_on_the_earlier_build_and_wrong_now(tmp_path: Path) -> None:
    for build, wrong, passed in (
        ("old", set(), True),
        ("older", {"fact-japan"}, True),
        ("bad", set(), False),
    ):
        (tmp_path / f"build-{build}").mkdir()
        body = record(1, wrong, build) | {"passed": passed}
        (tmp_path / f"build-{build}" / state.BUILD_VERIFICATION).write_text(json.dumps(body))
    os.utime(tmp_path / "build-older" / state.BUILD_VERIFICATION, (1, 1))  # the oldest
    earlier = gate.earlier_build(tmp_path, "new")
    assert earlier is not None and earlier["build_id"] == "old"  # the newest passed one, never a failed one
    assert gate.earlier_build(tmp_path, "old")["build_id"] == "older"  # type: ignore[index]
    now = record(1, {"fact-japan", "json-0"})["results"]
    assert gate.regressions(now, earlier["results"]) == ["fact-japan", "json-0"]
    assert gate.regressions(now, gate.earlier_build(tmp_path, "old")["results"]) == ["json-0"]  # type: ignore[index]


# A right model worded otherwise, as raw GLM-5 output (an estimate: the wordings of the realistic-box audit's table,
# ../shared/research/turn4-audits/realbox-audit-2026-12-03.md F2, not measured from GLM-5), a token a word.
THINKING = " ".join(["Adding the journey to the departure time, step by step."] * 333)  # 2,997 words
COUNTRIES = {"Lisbon": "Portugal", "Madrid": "Spain", "Vienna": "Austria", "Prague": "Czechia", "Dublin": "Ireland",
             "Warsaw": "Poland"}  # fmt: skip


def worded_otherwise(item: items.Item, at: int = 0) -> str:
    """ITEM's right answer as GLM-5 might write it (the raw text, before SGLang's parsers); AT picks a variant."""
    if item.kind == "tool":
        name, arguments = item.expected
        city = arguments["location"]
        return (f"<tool_call>{name}<arg_key>location</arg_key><arg_value>{city}, {COUNTRIES[city]}</arg_value>"
                f"<arg_key>unit</arg_key><arg_value>{arguments['unit']}</arg_value></tool_call>")  # fmt: skip
    if item.kind == "json":
        return f"Here is the JSON object:\n```json\n{json.dumps(item.expected, indent=2)}\n```"
    if item.kind == "reasoning":
        h, m = map(int, re.findall(r"\d+", item.expected))
        time_of_day = (f"{h}:{m:02d} p.m.", f"{h + 12}:{m:02d}")[at % 2]
        return f"{THINKING}</think>The train arrives at {time_of_day}" + ("" if at % 2 == 0 else ".")
    if item.kind == "arithmetic":
        a, b, c, d = map(int, re.findall(r"\d+", item.prompt)[:4])
        return f"({a} + {b}) * {c} - {d} = {a + b} * {c} - {d} = {(a + b) * c} - {d} = {item.expected}"
    if item.kind == "retrieval":
        name = re.search(r"secret code for (\w+)\?", item.prompt).group(1)  # type: ignore[union-attr]
        return f"The secret code for {name} is **{item.expected}**."
    return f"The capital is {item.expected}."


def cut(text: str, max_tokens: int) -> tuple[str, str]:
    words = text.split(" ")
    return (" ".join(words[:max_tokens]), "length") if len(words) > max_tokens else (text, "stop")


def parsed(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages SGLang 0.5.23's glm45 and glm47 parsers make of the raw texts (.venv-bench's sglang)."""
    if not BENCH_PYTHON.exists():
        pytest.skip(".venv-bench missing: run ci/setup-test-env (the parsers import transformers)")
    found = oracles.ask(PARSER_ORACLE, {"cases": cases}, python=str(BENCH_PYTHON))
    messages: list[dict[str, Any]] = found["messages"]
    return messages


@functools.cache
def through_the_parsers() -> tuple[
    dict[tuple[int, str, int], tuple[dict[str, Any], str]], list[dict[str, Any]]
]:
    """Every item worded otherwise (both variants), cut at its bound and at the raised one, and three probes of the parsers' own output, through
    SGLang's parsers in one run of the oracle (it imports sglang: seconds): the replies by (variant, prompt, bound)
    with their finish_reason, and the probes' messages."""
    keys, cases = [], []
    for at in (0, 1):
        for item in items.generate():
            for bound in (item.max_tokens, item.max_tokens * run.LENGTH_FACTOR):
                text, finish = cut(worded_otherwise(item, at), bound)
                keys.append((at, item.prompt, bound, finish))
                cases.append({"text": text, "thinking": item.thinking, "tools": item.tools})
    tool, reasoning = the("tool-madrid"), the("reasoning-train")
    probes = [
        {"text": worded_otherwise(tool), "thinking": False, "tools": tool.tools},
        {"text": worded_otherwise(reasoning), "thinking": True, "tools": []},
        {"text": THINKING, "thinking": True, "tools": []},
    ]
    messages = parsed(cases + probes)
    replies = {(at, prompt, bound): (message, finish)
               for (at, prompt, bound, finish), message in zip(keys, messages[: len(cases)], strict=True)}  # fmt: skip
    return replies, messages[len(cases) :]


def parser_asker(at: int = 0) -> tuple[run.Ask, list[int]]:
    """An Ask answering every item worded otherwise, cut at the request's max_tokens, through SGLang's parsers; and
    the bounds asked, in order."""
    replies = through_the_parsers()[0]
    asked: list[int] = []

    def ask(request: dict[str, Any]) -> run.Reply:
        asked.append(request["max_tokens"])
        message, finish = replies[(at, request["messages"][0]["content"], request["max_tokens"])]
        return run.Reply(message, len(request["messages"][0]["content"]) // 4, finish)

    return ask, asked


# The tests reading through_the_parsers share one worker, so its one oracle run (sglang imported: about 8 CPU-seconds)
# is made once, not once a worker.
PARSERS = pytest.mark.xdist_group("sglang_parsers")


@PARSERS
@pytest.mark.parametrize("at", [0, 1], ids=["5:15 p.m.", "17:15"])
def test_a_right_model_worded_otherwise_passes_through_sglangs_own_parsers(at: int) -> None:
    """Madrid, Spain; JSON after a preface; 5:15 p.m. and 17:15; working before the number (cut at 16 tokens first);
    thinking past the 2,048-token bound (content empty first): each asked again at 4x the bound where cut."""
    ask, asked = parser_asker(at)
    found = run.settled(ask, "glm-5", pause=0)
    assert found["passed"] and found["runs"] == 1, (found["reasons"], [
        (r["id"], r["received"]) for r in found["results"] if not r["right"]])  # fmt: skip
    rows = {r["id"]: r for r in found["results"]}
    assert rows["reasoning-train"]["attempts"] == 2 and rows["reasoning-train"]["max_tokens"] == 8192
    assert rows["arithmetic-b32-0"]["max_tokens"] == 64 and rows["fact-france"]["max_tokens"] == 16
    assert asked.count(2048) == asked.count(8192) == 1


def test_every_test_that_reads_the_parsers_run_is_in_its_group() -> None:
    """A test reading through_the_parsers outside the group runs the oracle again on its own worker."""
    readers = {
        name: {m.args for m in getattr(fn, "pytestmark", []) if m.name == "xdist_group"}
        for name, fn in globals().items()
        if name.startswith("test_")
        and re.search(r"\b(through_the_parsers|parser_asker)\(", inspect.getsource(fn))
    }
    assert len(readers) == 2 and all(g == {("sglang_parsers",)} for g in readers.values()), readers


@PARSERS
def test_sglangs_parsers_give_the_messages_the_judges_read() -> None:
    """The oracle's messages are SGLang's: a glm47 call with a JSON-string argument object, thinking split off."""
    call, thought, unfinished = through_the_parsers()[1]
    assert call["tool_calls"][0]["function"]["name"] == "get_weather" and not call["content"]
    assert json.loads(call["tool_calls"][0]["function"]["arguments"])["location"] == "Madrid, Spain"
    assert thought["content"].startswith("The train arrives at") and thought["reasoning_content"]
    assert unfinished["content"] == "" and unfinished["reasoning_content"]  # past the bound: no answer yet


def message_of(kind: str, text: str) -> dict[str, Any]:
    if kind == "tool":
        return {"content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": text}}]}
    if kind == "reasoning":
        return {"content": text, "reasoning_content": "2:30 pm plus 2 h 45 min"}
    return {"content": text}


# What counts as the same answer (items.SAME_ANSWER), per kind: (item, reply text, right?). Wrong ones are the
# corruptions the gate exists for, or another answer.
SAME_ANSWER_TABLE = [
    ("fact-france", "Paris", True),
    ("fact-france", "The capital of France is **Paris**.", True),
    ("fact-france", "paris.", True),
    ("fact-france", "Lyon", False),
    ("fact-france", "Parisian", False),
    ("fact-france", "zq!! 0x0", False),
    ("arithmetic-b1-0", "{v}", True),
    ("arithmetic-b1-0", "(a + b) * c - d = 1 * 2 - 3 = {v}", True),
    ("arithmetic-b1-0", "**{v}**", True),
    ("arithmetic-b1-0", "{v}.0", True),
    ("arithmetic-b1-0", "{v} + 1", False),  # the last number is the answer
    ("arithmetic-b1-0", "{w}", False),
    ("arithmetic-b1-0", "", False),
    ("retrieval-4000", "{v}", True),
    ("retrieval-4000", "The secret code for Dora is `{v}`.", True),
    ("retrieval-4000", "{v}X", False),
    ("retrieval-4000", "zq!! ##\u00a4 0x0", False),
    ("json-0", "{j}", True),
    ("json-0", "Here is the JSON object:\n```json\n{j}\n```", True),
    ("json-0", "{jl}", True),  # keys in another order, strings in another case, 12.0 for 12
    ("json-0", "{jx}", True),  # another key besides
    ("json-0", "{jw}", False),  # a value off
    ("json-0", "{jm}", False),  # a key missing
    ("json-0", '{{"parcel": ', False),  # cut: not JSON
    ("tool-madrid", '{{"location": "Madrid", "unit": "{u}"}}', True),
    ("tool-madrid", '{{"location": "Madrid, Spain", "unit": "{u}"}}', True),
    ("tool-madrid", '{{"location": "madrid", "unit": "{U}"}}', True),
    ("tool-madrid", '{{"location": "Barcelona, Spain", "unit": "{u}"}}', False),
    ("tool-madrid", '{{"location": "Madrid or Lisbon", "unit": "{u}"}}', False),
    ("tool-madrid", '{{"location": "Madrid", "unit": "kelvin"}}', False),
    ("tool-madrid", '{{"location": "Madrid", "unit": "{u}",', False),  # mangled: not JSON
    ("tool-madrid", '["Madrid", "{u}"]', False),
    ("reasoning-train", "It arrives at {h}:{m} pm.", True),
    ("reasoning-train", "{h}:{m}pm", True),
    ("reasoning-train", "The train arrives at {h}:{m} p.m.", True),
    ("reasoning-train", "{H}:{m}", True),
    ("reasoning-train", "{h}.{m} PM", True),
    ("reasoning-train", "{h}:{m}", True),  # no am/pm: pm, as the question's times are
    ("reasoning-train", "{h}:{m} am", False),
    ("reasoning-train", "{H}:{n}", False),
    ("reasoning-train", "", False),
]


def filled(item: items.Item, text: str) -> str:
    fields: dict[str, Any] = {}
    if item.kind == "arithmetic":
        fields = {"v": item.expected, "w": item.expected + 1}
    elif item.kind == "retrieval":
        fields = {"v": item.expected}
    elif item.kind == "json":
        e = item.expected
        fields = {
            "j": json.dumps(e),
            "jl": json.dumps({"city": e["city"].upper(), "kg": float(e["kg"]), "parcel": e["parcel"]}),
            "jx": json.dumps(e | {"note": "fragile"}),
            "jw": json.dumps(e | {"kg": e["kg"] + 1}),
            "jm": json.dumps({k: v for k, v in e.items() if k != "city"}),
        }
    elif item.kind == "tool":
        fields = {"u": item.expected[1]["unit"], "U": item.expected[1]["unit"].upper()}
    elif item.kind == "reasoning":
        h, m = map(int, re.findall(r"\d+", item.expected))
        fields = {"h": h, "H": h + 12, "m": f"{m:02d}", "n": f"{(m + 1) % 60:02d}"}
    return text.format(**fields)


@pytest.mark.parametrize(("item_id", "text", "right"), SAME_ANSWER_TABLE)
def test_each_judge_accepts_every_wording_of_the_right_answer_and_nothing_else(
    item_id: str, text: str, right: bool
) -> None:
    item = the(item_id)
    assert item.judge(message_of(item.kind, filled(item, text)))[0] is right


def test_every_kind_says_what_counts_as_the_same_answer_and_its_tolerance() -> None:
    kinds = {i.kind for i in items.generate()}
    assert set(items.SAME_ANSWER) == kinds == set(run.TOLERANCE)
    assert all(reason for _share, reason in run.TOLERANCE.values())
    allowed = {(i.kind, i.batch): 0 for i in items.generate()}
    for key in allowed:
        allowed[key] = run.allowed_misses(key[0], sum((i.kind, i.batch) == key for i in items.generate()))
    assert allowed == {("fact", 1): 1, ("arithmetic", 1): 1, ("arithmetic", 8): 2, ("arithmetic", 32): 8,
                       ("retrieval", 1): 0, ("json", 1): 0, ("tool", 1): 0, ("reasoning", 1): 0}  # fmt: skip


def test_the_json_items_test_the_structured_output_path_not_arithmetic() -> None:
    for item in (i for i in items.generate() if i.kind == "json"):
        request = item.request("glm-5")
        assert request["response_format"]["type"] == "json_schema"
        schema = request["response_format"]["json_schema"]["schema"]
        assert set(schema["required"]) == set(item.expected)
        assert all(str(value) in item.prompt for value in item.expected.values())  # copied, not worked out


def scripted(script: dict[str, list[Any]]) -> tuple[run.Ask, list[tuple[str, int]]]:
    """An Ask that answers right, except items named in SCRIPT, which take its entries in turn: an exception (raised),
    a (text, finish_reason) pair; and the (id, max_tokens) of each ask."""
    by_prompt = {i.prompt: i for i in items.generate()}
    asked: list[tuple[str, int]] = []

    def ask(request: dict[str, Any]) -> run.Reply:
        item = by_prompt[request["messages"][0]["content"]]
        asked.append((item.id, request["max_tokens"]))
        if script.get(item.id):
            step = script[item.id].pop(0)
            if isinstance(step, Exception):
                raise step
            return run.Reply(message_of(item.kind, step[0]), 10**6, step[1])
        return run.Reply(right_answer(item), 10**6, "stop")

    return ask, asked


def pauses_only_here(monkeypatch: pytest.MonkeyPatch, slept: list[float]) -> None:
    """verify/run.py's pauses recorded instead of slept: its own `time` replaced, not the time module every thread
    of this worker shares (a fixture's thread polling meanwhile would record its sleeps too)."""
    monkeypatch.setattr(run, "time", SimpleNamespace(monotonic=time.monotonic, sleep=slept.append))


def test_a_cut_reply_is_asked_again_once_at_four_times_its_bound_then_is_inconclusive() -> None:
    ask, asked = scripted({"arithmetic-b1-0": [("(1 + 2) * 3 - 4 = 3 * 3", "length")],
                           "arithmetic-b1-1": [("(1 + 2) * 3", "length"), ("(1 + 2) * 3 - 4 = 9 - 4", "length")]})  # fmt: skip
    results = {r.id: r for r in run.run(ask, "glm-5", pause=0)}
    assert results["arithmetic-b1-0"].right and results["arithmetic-b1-0"].max_tokens == 64
    assert [b for i, b in asked if i == "arithmetic-b1-0"] == [16, 64]
    unsure = results["arithmetic-b1-1"]
    assert unsure.outcome == "inconclusive" and not unsure.right and "cut at max_tokens 64" in unsure.received
    assert [b for i, b in asked if i == "arithmetic-b1-1"] == [16, 64]  # once, not again


def test_a_transport_error_is_asked_again_up_to_its_bound_then_is_inconclusive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    pauses_only_here(monkeypatch, slept)
    errors: dict[str, list[Any]] = {
        "fact-japan": [TimeoutError("timed out"), ConnectionResetError("reset")],
        "retrieval-32000": [TimeoutError("timed out")] * 5,
    }
    ask, _asked = scripted(errors)
    results = {r.id: r for r in run.run(ask, "glm-5")}
    assert results["fact-japan"].right and results["fact-japan"].attempts == 3
    unsure = results["retrieval-32000"]
    assert unsure.outcome == "inconclusive" and unsure.attempts == run.TRANSPORT_ATTEMPTS == 3
    assert "TimeoutError" in unsure.received and slept == [run.TRANSPORT_PAUSE] * 4
    found = run.summary(list(results.values()))
    # Inconclusive counts against its group like a miss, and the verdict names it apart from a wrong answer.
    assert not found["passed"] and found["verdict"] == "inconclusive"
    assert found["reasons"] == ["retrieval: inconclusive retrieval-32000"]
    assert found["inconclusive"] == ["retrieval-32000"]


def test_a_refused_request_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 401 (a wrong key) or a 400 answers the same on every ask: asked once, inconclusive with the status, no
    pause; a 429 or a 503 may pass and is asked again. Both clients' errors: urllib's HTTPError (the gate's) and the
    openai client's APIStatusError (ci/smoke's), which carries the status as status_code."""
    slept: list[float] = []
    pauses_only_here(monkeypatch, slept)

    class StatusError(Exception):  # the openai client's shape: the status on the exception
        def __init__(self, status_code: int) -> None:
            super().__init__(f"Error code: {status_code}")
            self.status_code = status_code

    def http_error(code: int) -> urllib.error.HTTPError:
        return urllib.error.HTTPError("http://x/v1/chat/completions", code, "refused", Message(), None)

    ask, asked = scripted({
        "fact-japan": [http_error(401)] * 3,
        "fact-italy": [StatusError(400)] * 3,
        "fact-egypt": [http_error(429), StatusError(503)],
    })  # fmt: skip
    results = {r.id: r for r in run.run(ask, "glm-5")}
    for refused, status in (("fact-japan", "401"), ("fact-italy", "400")):
        assert results[refused].outcome == "inconclusive" and results[refused].attempts == 1
        assert status in results[refused].received and "refused" in results[refused].received
        assert [i for i, _ in asked].count(refused) == 1
    assert results["fact-egypt"].right and results["fact-egypt"].attempts == 3
    assert slept == [run.TRANSPORT_PAUSE] * 2  # the 429 and the 503 only


def test_a_group_failing_on_wrong_answers_is_wrong_even_with_inconclusive_ones() -> None:
    script: dict[str, list[Any]] = {f"arithmetic-b1-{i}": [("zq!! 0x0", "stop")] for i in range(2)}
    script["arithmetic-b1-3"] = [TimeoutError("timed out")] * 3
    ask, _asked = scripted(script)
    found = run.summary(run.run(ask, "glm-5", pause=0))
    assert found["verdict"] == "wrong" and found["reasons"] == [
        "arithmetic at batch 1: 1/4 right (wrong: arithmetic-b1-0, arithmetic-b1-1; inconclusive: arithmetic-b1-3)"
    ]


def flaky_first_run(broken: set[str]) -> Callable[[dict[str, Any]], run.Reply]:
    """Answers BROKEN wrongly in the first whole run only (a transient fault), rightly after."""
    good, seen = asker(), Counter[str]()

    def ask(request: dict[str, Any]) -> run.Reply:
        prompt = request["messages"][0]["content"]
        seen[prompt] += 1
        item = next(i for i in items.generate() if i.prompt == prompt)
        if item.id in broken and seen[prompt] == 1:
            return run.Reply({"content": "zq!! 0x0"}, 10**6, "stop")
        return good(request)

    return ask


def test_the_whole_set_runs_once_more_before_a_start_is_called_wrong() -> None:
    once = run.settled(flaky_first_run({"retrieval-4000", "tool-madrid"}), "glm-5", pause=0)
    assert once["passed"] and once["runs"] == 2 and once["first_run"]["verdict"] == "wrong"
    assert once["first_run"]["reasons"] == ["retrieval: wrong retrieval-4000", "tool: wrong tool-madrid"]
    always = run.settled(asker({"tool-madrid"}), "glm-5", pause=0)
    assert not always["passed"] and always["runs"] == 2 and always["verdict"] == "wrong"
    assert run.settled(asker(), "glm-5", pause=0)["runs"] == 1  # a pass is not asked twice


def test_the_readme_describes_the_verification_set_as_it_is() -> None:
    """It once said the facts ran in batches too (they run alone) and left the counts out."""
    kinds = Counter((i.kind, i.batch) for i in items.generate())
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = (
        f"{sum(kinds.values())} items from a fixed seed: {kinds['fact', 1]} facts, arithmetic alone "
        f"({kinds['arithmetic', 1]}) and in batches of 8 and 32, a planted code retrieved from 1.5k to 32k tokens "
        f"({kinds['retrieval', 1]}), JSON through SGLang's structured output ({kinds['json', 1]}), "
        f"{kinds['tool', 1]} tool calls, {kinds['reasoning', 1]} reasoning answer)"
    )
    assert said in readme, said
    assert set(kinds) == {("fact", 1), ("arithmetic", 1), ("arithmetic", 8), ("arithmetic", 32), ("retrieval", 1),
                          ("json", 1), ("tool", 1), ("reasoning", 1)}  # fmt: skip
    assert kinds["arithmetic", 8] == 8 and kinds["arithmetic", 32] == 32


def test_every_answer_empty_or_one_token_repeated_is_degenerate_not_wrong() -> None:
    """What NaN decode logits give (the attention backend's fault, reported on this box class: GLM5_DSA_BACKEND's doc):
    every reply empty, or one token over and over. The verdict says so, and names nothing else wrong: a start judged
    so fails as `degenerate_answers`, whose fix is the next backend to try."""
    assert run.degenerate({"content": ""}) and run.degenerate({"content": None, "reasoning_content": None})
    assert run.degenerate({"content": "!!!!!!!!!!!!"}) and run.degenerate({"content": "the the the the"})
    assert run.degenerate({"content": "", "reasoning_content": "<unk> <unk> <unk> <unk> <unk>"})
    assert not run.degenerate({"content": "391"}) and not run.degenerate({"content": "zq!! 0x0"})
    assert not run.degenerate({"content": "", "tool_calls": [{"function": {"name": "get_weather"}}]})

    def every(message: dict[str, Any]) -> run.Ask:
        return lambda request: run.Reply(dict(message), 100_000, "length")

    for message in ({"content": ""}, {"content": "!" * 64}, {"content": "", "reasoning_content": "a " * 40}):
        results = run.run(every(message), "glm-5")
        assert run.outcome(results) == "degenerate" and run.summary(results)["verdict"] == "degenerate", (
            message
        )
    wrong = run.run(asker({i.id for i in items.generate() if i.kind == "arithmetic"}), "glm-5")
    assert run.outcome(wrong) == "wrong"  # wrong answers with words in them: not the backend's NaN
    mixed = run.run(
        lambda r: run.Reply({"content": "" if "17" in str(r) else "zq!! 0x0"}, 100_000, "stop"), "glm-5"
    )
    assert run.outcome(mixed) == "wrong"  # some degenerate, not all
    found = probe.verification_of(run.summary(run.run(every({"content": ""}), "glm-5")) | {"start": 1}, 1)
    assert found is not None and found.verdict == "degenerate"


def first_token_then_a_run(request: dict[str, Any]) -> run.Reply:
    """What NaN decode logits give (the audit's F6, ../shared/research/audits-2026-12-07/start-audit-2026-12-07.md):
    the first token is sampled from the prefill's logits, so it is right; every later greedy step takes the argmax of
    an all-NaN row, index 0 ("!" here), to the token bound."""
    prompt = request["messages"][0]["content"]
    item = next(i for i in items.generate() if i.prompt == prompt)
    first = {"json": '{"', "tool": "<tool_call>", "reasoning": "A train"}.get(
        item.kind, str(item.expected)[:4]
    )
    return run.Reply({"content": first + "!" * (request["max_tokens"] - 1)}, 100_000, "length")


def test_a_reply_that_ends_in_a_run_of_one_repeated_token_is_degenerate_and_never_right() -> None:
    """Issue 52: the judges scored `Paris!!!!...` (and `133!!!!...`) right and not degenerate, so a broken decode
    failed as wrong_answers and the operator lost the GLM5_DSA_BACKEND hint of degenerate_answers."""
    fact = next(i for i in items.generate() if i.id == "fact-france")
    sums = next(i for i in items.generate() if i.kind == "arithmetic")
    for item, text in ((fact, "Paris" + "!" * 15), (sums, f"{sums.expected}" + "!" * 15),
                       (fact, "Paris" + " the" * 12), (fact, "Paris" + "\n" * 15)):  # fmt: skip
        assert run.degenerate({"content": text}), text
        right, received = run.judged(item, run.Reply({"content": text}, 30, "length"))
        assert not right and received.endswith("(degenerate: it ends in a run of one repeated token)"), text
    thought = {"content": "", "reasoning_content": "A train" + "!" * 40}
    assert run.degenerate(thought) and run.degenerate({"content": '{"parcel": "' + "!" * 50})
    # a right reply, a reasoning before the reply, a short run: not degenerate
    assert not run.degenerate({"content": "Paris!!!"}) and not run.degenerate({"content": "1000000"})
    assert not run.degenerate({"content": "5:15 pm", "reasoning_content": "think " * 40})
    assert run.judged(fact, run.Reply({"content": "Paris."}, 30, "stop")) == (True, "Paris.")
    results = run.run(first_token_then_a_run, "glm-5")
    assert not any(r.right for r in results), [r.id for r in results if r.right]
    assert run.outcome(results) == "degenerate" and run.summary(results)["verdict"] == "degenerate"
