"""The healthcheck against real SGLang logs: excerpts quoted from public issues, pull requests and repositories
(tests/fixtures/logs/real/, each cited in sources.toml), read by the same scan and decision as the probe."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from configuration import state
from conftest import ROOT
from healthcheck import logscan, phase, probe, verdict
from helpers.judging import decided, judged

CORPUS = ROOT / "tests" / "fixtures" / "logs" / "real"
EXCERPTS: list[dict[str, Any]] = tomllib.loads((CORPUS / "sources.toml").read_text())["excerpt"]
ON_THE_WAY = verdict.ON_THE_WAY


def judge(data: bytes) -> dict[str, Any]:
    """The phase from the log alone, as `healthcheck --log FILE --no-http` on a foreign log: no launch.json,
    no configured counts, the process unknown."""
    scan = logscan.scan(data)
    expected = probe.expected_counts(scan, None)
    return judged(scan, tuple(expected), verify="off", offline=True).as_json()


def text_of(excerpt: dict[str, Any]) -> bytes:
    return (CORPUS / excerpt["file"]).read_bytes()


def test_the_corpus_is_real_cited_and_large_enough() -> None:
    files = {p.name for p in CORPUS.glob("*.log")}
    assert files == {e["file"] for e in EXCERPTS} and len(files) >= 30
    for e in EXCERPTS:
        assert e["url"].startswith("https://github.com/"), e["file"]
        for key in ("version", "date", "hardware", "shows"):
            assert str(e[key]).strip(), f"{e['file']}: no {key}"
        assert isinstance(e["edited"], bool) and (not e["edited"] or e["note"].strip()), e["file"]


def test_the_corpus_covers_what_the_healthcheck_must_tell_apart() -> None:
    phases = [e["phase"] for e in EXCERPTS]
    least = {"ready": 5, "failed": 15, "capturing": 5, "loading": 3, "starting": 2, "warming_up": 2}
    assert all(phases.count(p) >= n for p, n in least.items()), {p: phases.count(p) for p in least}
    everything = b"\n".join(text_of(e) for e in EXCERPTS)
    for needle in (
        b"Capture cuda graph end",  # legacy decode
        b"Capture piecewise CUDA graph begin",  # the piecewise era
        b"Capture target prefill CUDA graph begin. backend=breakable",  # 0.5.23's
        b"out of memory",
        b"torch._dynamo",
        b"Watchdog caught collective operation timeout",
        b"Scheduler hit an exception",
        b"Received sigquit from a child process",
        b"kill_process_tree",
    ):
        assert needle in everything, needle


@pytest.mark.parametrize("excerpt", EXCERPTS, ids=[e["file"] for e in EXCERPTS])
def test_each_excerpt_reads_as_its_source_shows(excerpt: dict[str, Any]) -> None:
    found = judge(text_of(excerpt))
    assert found["phase"] == excerpt["phase"], (found, excerpt.get("comment", ""))
    if excerpt["phase"] == "failed" and excerpt["reason"]:
        assert excerpt["reason"][:60] in text_of(excerpt).decode(errors="replace")


@pytest.mark.parametrize("excerpt", EXCERPTS, ids=[e["file"] for e in EXCERPTS])
def test_the_rules_every_excerpt_obeys(excerpt: dict[str, Any]) -> None:
    data = text_of(excerpt)
    scan = logscan.scan(data)
    found = judge(data)
    if "ready" in scan.seen:  # once ready, never a phase on its way
        assert found["phase"] in ("ready", "failed"), found
    if found["phase"] == "failed":
        assert found["reason"], found
    # Only the current start counts: an earlier failed start before the kit's marker changes nothing.
    earlier = text_of(next(e for e in EXCERPTS if e["phase"] == "failed"))
    marker = state.marker_line(2, "2026-11-30T10:00:00+00:00", 9, 52, 58).encode()
    alone = judge(marker + b"\n" + data)
    after_a_failure = judge(earlier + b"\n" + marker + b"\n" + data)
    assert after_a_failure == alone


def test_a_dynamo_failure_is_named_by_its_exception() -> None:
    """torch._dynamo.exc.Unsupported is not an ...Error: the reason still names it (the failure patch 0001 is about)."""
    for prefix in ("33-", "34-"):
        (excerpt,) = [e for e in EXCERPTS if e["file"].startswith(prefix)]
        found = judge(text_of(excerpt))
        assert found["phase"] == "failed" and "torch._dynamo.exc.Unsupported: " in found["reason"], found[
            "reason"
        ]


def test_the_capacity_line_of_real_logs_is_read_as_printed() -> None:
    """0.5.23's scheduler line (srt/managers/scheduler.py:1269), as two real starts printed it (one with a rank
    prefix): the healthcheck's capacity, and the status line that shows it once ready."""
    real = ROOT / "tests" / "fixtures" / "logs" / "real"
    newest = logscan.scan(next(real.glob("13-*.log")).read_bytes())
    assert newest.capacity == {"max_total_num_tokens": 392920, "chunked_prefill_size": 8192,
                               "max_prefill_tokens": 16384, "max_running_requests": 4096, "context_len": 40960,
                               "available_gpu_mem_gb": 10.54}  # fmt: skip
    ranked = logscan.scan(next(real.glob("15-*.log")).read_bytes())
    assert ranked.capacity is not None and ranked.capacity["max_running_requests"] == 2913
    shown = decided(newest, (None, None), http=200, accept_partial=True)
    assert shown.capacity == newest.capacity | {"attn_dp_size": 1.0}  # TP attention: one pool
    assert "392920 KV tokens, 4096 running requests at most" in phase.status_line(shown, None)
    assert (
        logscan.scan(b"max_total_num_tokens=1, chunked_prefill_size=2").capacity is None
    )  # not a whole line
