"""One writer per state record, as configuration/state.py RECORDS says: the product modules that call a record's
writers (state.WRITERS) are exactly the ones the table names, so a second writer of failed.json (the gate once was
one) fails here; and verify/ imports nothing from entrypoint/. Read from the code's syntax trees, not run."""

from __future__ import annotations

import ast

from configuration import start, state
from conftest import ROOT

PRODUCT = ("common", "configuration", "entrypoint", "gateway", "healthcheck", "kernels", "monitoring", "patches",
           "verify", "ci")  # fmt: skip


def modules() -> dict[str, ast.Module]:
    found = {}
    for folder in PRODUCT:
        for file in sorted((ROOT / folder).rglob("*.py")):
            found[str(file.relative_to(ROOT))] = ast.parse(file.read_text(), str(file))
    return found


def callers(name: str, trees: dict[str, ast.Module]) -> set[str]:
    """Modules (other than configuration/state.py) that use state.NAME (a call, or a reference handed on, as
    functools.partial(state.write_stopped, ...)), or NAME imported from it."""
    out = set()
    for rel, tree in trees.items():
        if rel == "configuration/state.py":
            continue
        for node in ast.walk(tree):
            by_attr = (
                isinstance(node, ast.Attribute)
                and node.attr == name
                and getattr(node.value, "id", "") == "state"
            )
            by_name = isinstance(node, ast.Name) and node.id == name and imports_from_state(tree, name)
            if by_attr or by_name:
                out.add(rel)
    return out


def imports_from_state(tree: ast.Module, name: str) -> bool:
    return any(
        isinstance(n, ast.ImportFrom)
        and n.module == "configuration.state"
        and any(a.name == name for a in n.names)
        for n in ast.walk(tree)
    )


def test_each_record_is_written_only_by_the_modules_its_row_names() -> None:
    trees = modules()
    assert set(state.WRITERS) == {r.name for r in state.RECORDS}
    for record in state.RECORDS:
        writers = set().union(*(callers(fn, trees) for fn in state.WRITERS[record.name]))
        assert writers == set(record.writers), (record.name, writers)


def test_after_preflight_only_the_lifecycle_listener_records_a_failure() -> None:
    trees = modules()
    assert callers("write_failed", trees) == {"entrypoint/launch.py", "entrypoint/lifecycle.py"}
    launch = next(
        n
        for n in ast.walk(trees["entrypoint/launch.py"])
        if isinstance(n, ast.FunctionDef) and n.name == "refuse"
    )
    refusing = {n for n in ast.walk(trees["entrypoint/launch.py"]) if isinstance(n, ast.Call)
                and getattr(n.func, "attr", "") == "write_failed"}  # fmt: skip
    assert refusing and refusing <= set(ast.walk(launch))  # launch writes it in `refuse` (preflight) alone
    lifecycle = {n for n in ast.walk(trees["entrypoint/lifecycle.py"]) if isinstance(n, ast.Call)
                 and getattr(n.func, "attr", "") == "write_failed"}  # fmt: skip
    record = next(
        n
        for n in ast.walk(trees["entrypoint/lifecycle.py"])
        if isinstance(n, ast.FunctionDef) and n.name == "record"
    )
    assert len(lifecycle) == 1 and lifecycle <= set(ast.walk(record))  # through one function


def resolvers(trees: dict[str, ast.Module]) -> set[str]:
    """Modules that call configuration/config.py's or layout.py's `resolve` (as config.resolve, layout.resolve, or
    imported by name), other than those two."""
    out = set()
    for rel, tree in trees.items():
        if rel in ("configuration/config.py", "configuration/layout.py"):
            continue
        for node in ast.walk(tree):
            by_attr = (
                isinstance(node, ast.Attribute)
                and node.attr == "resolve"
                and isinstance(node.value, ast.Name)
                and node.value.id in ("config", "layout")
            )
            by_import = (
                isinstance(node, ast.ImportFrom)
                and node.module
                in (
                    "configuration.config",
                    "configuration.layout",
                )
                and any(a.name == "resolve" for a in node.names)
            )
            if by_attr or by_import:
                out.add(rel)
    return out


def test_after_launch_no_reader_resolves_the_configuration_again() -> None:
    """The start record (launch.json) is the only source of a start's facts once launch has written it: the gate, the
    probe, the exporter, the lifecycle listener and the bundle read it. A new caller of the resolver fails here until
    configuration/start.py RESOLVERS names it with its reason (one that runs before any start, or outside one)."""
    found = resolvers(modules())
    assert found == set(start.RESOLVERS), sorted(found ^ set(start.RESOLVERS))
    for reader in ("verify/gate.py", "healthcheck/probe.py", "entrypoint/bundle.py", "entrypoint/lifecycle.py",
                   "monitoring/exporter.py"):  # fmt: skip
        assert reader not in found


def test_verify_imports_nothing_from_entrypoint() -> None:
    for file in sorted((ROOT / "verify").glob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            assert not any(n == "entrypoint" or n.startswith("entrypoint.") for n in names), (file, names)


def test_the_internals_page_renders_the_table() -> None:
    page = (ROOT / "docs" / "internals.md").read_text()
    for record in state.RECORDS:
        assert f"| `{record.name}` | {', '.join(f'`{w}`' for w in record.writers)} |" in page
