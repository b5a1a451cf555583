"""The correctness gate of every start: once the server is up after its warm-up, answer the verification set against
it and record the result, so that the healthcheck counts the start as ready only when it answers rightly.

    verify/gate            run by supervisord beside the server (entrypoint/supervisord.conf), for each start
    verify/gate --once     verify the current start once, print the summary, exit 0 passed / 1 failed / 4 not up

Each start's result goes to the state folder (verified.json: what the healthcheck and the exporter read) and, per
build, to the cache volume ({cache_root}/verification.json, one folder per image build): a start of a different
build compares its items with the newest passed record of another build and lists those that went from right to
wrong (`regressed`), the first sign of a kernel regression after an upgrade. GLM5_VERIFY=off: nothing runs.

It only verifies: it writes its two verification records and nothing else. The judgement of a failed verification is
the healthcheck's (healthcheck/phase.py gated: under GLM5_VERIFY=enforce a start judged wrong or inconclusive in two
whole runs is failed, `wrong_answers` or `verify_inconclusive`), and the lifecycle listener records it and gives up
(entrypoint/lifecycle.py, the one recorder; exit codes 71, 72 and 77, common/report.py FAILURES). It stays out of service:
a replica answering the set wrongly twice, with judges that accept every wording of a right answer, is a build fault
that would answer clients wrongly too, and this holds when every replica judges itself wrong (a bad build is wrong on
all of them): an outage that pages (GLM5StartFailed, GLM5VerificationFailed) rather than wrong answers served
quietly. GLM5_VERIFY=report serves anyway, with the alert.

A start that ends while it is being verified (its server crashed, or was stopped or restarted) is no longer current:
the run stops at its next ask and records nothing, and the next start is verified on its own once it is up.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.report import FAILED, INVALID_SETTING, NEVER_READY, OK, Log
from configuration import state
from configuration.start import Start
from healthcheck import probe
from healthcheck.verdict import Phase
from verify import items as item_set
from verify import run

LOG = Log("verify")
POLL_SECONDS = 2.0
REQUEST_TIMEOUT = (
    600.0  # one item: the 32k retrieval prefill is ~8 s on the box; a stuck server is the watchdog's
)


def regressions(now: list[dict[str, Any]], before: list[dict[str, Any]]) -> list[str]:
    """The items right in the earlier record and wrong now, by id (the set is fixed by its seed: ids match)."""
    right_before = {r["id"] for r in before if r.get("right")}
    return sorted(r["id"] for r in now if not r["right"] and r["id"] in right_before)


def earlier_build(cache_dir: Path, build_id: str) -> dict[str, Any] | None:
    """The newest passed record of another build on this cache volume."""
    found = []
    for file in cache_dir.glob(f"build-*/{state.BUILD_VERIFICATION}"):
        record = state.read_json(file)
        if record and record.get("build_id") != build_id and record.get("passed"):
            found.append((file.stat().st_mtime, record))
    return max(found, key=lambda pair: pair[0])[1] if found else None


def record_for_build(launch: Start, record: dict[str, Any]) -> None:
    """Keep the result on the cache volume for this build; a volume that cannot take it costs the comparison only."""
    folder = Path(launch.cache_root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        state.write_whole(folder / state.BUILD_VERIFICATION, json.dumps(record) + "\n")
    except OSError as err:
        LOG.warning(
            f"cannot keep the result in {folder} ({err.strerror}): the next build cannot compare with it"
        )


def still_current(state_dir: str | Path, start: int) -> bool:
    """Start `start` is the latest and its server process (launch --serve) lives."""
    launch = state.current_start(state.read_launch(state_dir), start)
    return launch is not None and probe.pid_alive(launch.pid)


def require_current(state_dir: str | Path, start: int) -> None:
    """Raise run.Abandoned when start `start` has ended: nothing of its verification is to be judged or written."""
    if not still_current(state_dir, start):
        raise run.Abandoned(f"start #{start} ended during its verification")


def while_current(ask: run.Ask, state_dir: str | Path, start: int) -> run.Ask:
    """`ask`, for as long as start `start` is current: before each ask, and after one that raised (a refused
    connection is how a crashed server answers), a start that ended raises run.Abandoned."""

    def current_ask(request: dict[str, Any]) -> run.Reply:
        require_current(state_dir, start)
        try:
            return ask(request)
        except Exception:
            require_current(state_dir, start)
            raise

    return current_ask


def verify(launch: Start, state_dir: Path, ask: run.Ask) -> dict[str, Any]:
    """Answer the set (twice when the first run fails) for the start `launch` records, judge it, compare it with the
    newest passed record of another build; the whole record, written to verified.json and the cache volume. Raises
    run.Abandoned, writing nothing, when the start ends meanwhile."""
    start = launch.start
    LOG.info(f"start #{start}: answering the verification set before the start counts as ready")
    # Under DP attention each batch is sent once per attention group, so every group runs it (verify/items.py).
    found = run.settled(
        while_current(ask, state_dir, start),
        launch.served_model_name,
        item_set.generate(groups=launch.attn_dp_size),
    )
    earlier = earlier_build(Path(launch.cache_dir), launch.build_id)
    record = found | {
        "start": start,
        "build_id": launch.build_id,
        "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "compared_with": earlier["build_id"] if earlier else None,
        "regressed": regressions(found["results"], earlier["results"]) if earlier else [],
    }
    said = f"{found['right']}/{found['items']} right in {found['seconds']} s"
    if found["first_run"] is not None:
        first = found["first_run"]
        LOG.warning(
            f"start #{start}: the first run was {first['verdict']} ({'; '.join(first['reasons'])}): ran again"
        )
    # It may have ended after the last ask (a stop, a drain): then nothing is written.
    require_current(state_dir, start)
    if not found["passed"] and launch.verify == "report":
        LOG.warning(f"start #{start}: verification {found['verdict']}; serving anyway (GLM5_VERIFY=report)")
    state.write_verified(state_dir, record)
    record_for_build(launch, record)
    if record["regressed"]:
        LOG.warning(f"right on build {record['compared_with']}, wrong now: {', '.join(record['regressed'])}")
    if found["passed"]:
        LOG.info(f"start #{start}: verified, {said}")
    else:
        LOG.error(
            f"start #{start}: verification {found['verdict'].upper()}, {said}: {'; '.join(found['reasons'])}"
        )
    return record


def awaiting(environ: Mapping[str, str]) -> int | None:
    """The start to verify now: one the healthcheck holds at verifying (up after its warm-up, its own verification
    not yet there) whose /health answers 200, else None."""
    settings = probe.run_of(environ)
    found = probe.verdict(settings)
    if found.phase is not Phase.VERIFYING:
        return None
    url = f"http://127.0.0.1:{settings.port}"
    return found.start if probe.http_status(url, "/health", settings.timeout) == 200 else None


def asker_for(launch: Start, api_key: str | None) -> run.Ask:
    return run.http_asker(f"http://127.0.0.1:{launch.port}", api_key, REQUEST_TIMEOUT)


def verify_start(state_dir: Path, start: int, api_key: str | None) -> dict[str, Any] | None:
    """Verify start `start` by its own record (its port, served name, groups, build); None when it is no longer the
    latest start (its record was replaced)."""
    launch = state.current_start(state.read_launch(state_dir), start)
    if launch is None:
        return None
    return verify(launch, state_dir, asker_for(launch, api_key))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verify/gate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--once", action="store_true", help="verify the current start once and exit")
    args = parser.parse_args(argv)
    # Where the records are and the client key: the settings (every fact of a start is its record's, launch.json).
    values, problems = state.supervised(os.environ, create=False)
    if problems:  # preflight records the same problems as the start's failure: no server will start
        LOG.problems(problems, "invalid setting(s): no start to verify")
        return OK if not args.once else INVALID_SETTING  # under supervisord: done, not a process to restart
    if values["verify"] == "off" and not args.once:
        LOG.warning("GLM5_VERIFY=off: starts count as ready without the verification set")
        return OK
    state_dir, api_key = Path(values["state_dir"]), values["api_key"]
    if args.once:
        latest = state.read_launch(state_dir)
        start = awaiting(os.environ) or (latest.start if latest else None)
        if start is None:
            LOG.error("no start of the server to verify (healthcheck --status says why)")
            return NEVER_READY
        try:
            record = verify_start(state_dir, start, api_key)
        except run.Abandoned as err:
            LOG.error(f"{err}: nothing recorded")
            return NEVER_READY
        if record is None:
            LOG.error(f"start #{start} is no longer the latest: nothing recorded")
            return NEVER_READY
        print(json.dumps({k: v for k, v in record.items() if k != "results"}, indent=2))
        return OK if record["passed"] else FAILED
    # Each start once; the log is probed only while the current start has no verified.json of its own.
    while True:
        latest = state.read_launch(state_dir)
        done = (state.read_verified(state_dir) or {}).get("start")
        if latest is not None and latest.start != done and (start := awaiting(os.environ)) is not None:
            try:
                verify_start(state_dir, start, api_key)
            except run.Abandoned as err:
                LOG.warning(f"{err}: nothing recorded; the next start is verified on its own once it is up")
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
