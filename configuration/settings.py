"""Every GLM5_* variable, declared once in entrypoint/glm5.toml ([setting.*]), read and validated here.

`resolve(environ)` starts from [deployment], applies each declared setting's default and then the
environment, and returns the values; every problem (a malformed value, a bad default in glm5.toml, an
unknown or removed GLM5_* variable, VAR and VAR_FILE both set) is collected and raised together as
report.Problems, each naming the variable and the fix. Secrets come from VAR or VAR_FILE.

Import cost matters (the healthcheck probe may import this module): glm5.toml is read only by `load_config`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.report import INVALID_SETTING, Problem, Problems

CONFIG_PATH = Path(__file__).resolve().parent.parent / "entrypoint" / "glm5.toml"  # where the README names it
PREFIX = "GLM5_"
NAME_FORM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
TRUE, FALSE = ("1", "true", "yes"), ("0", "false", "no")
KINDS = ("int", "float", "choice", "path", "name", "args", "bool", "checks", "text", "secret")
WHERE = ("container", "host", "ci")
_LOADED: dict[Path, dict[str, Any]] = {}


class Setting:
    """One declaration from glm5.toml's [setting.NAME] table."""

    def __init__(self, name: str, spec: Mapping[str, Any], deployment: Mapping[str, Any]) -> None:
        self.name = name
        self.kind: str = spec["kind"]
        self.key: str = spec.get("key", name.removeprefix(PREFIX).lower())
        self.doc: str = spec["doc"]
        self.flag: str | None = spec.get("flag")
        self.where: str = spec.get("where", "container")
        self.choices: list[str] = list(spec.get("choices", []))
        self.low, self.high = (bound(spec.get(k), deployment) for k in ("min", "max"))
        self.min_length: int = spec.get("min_length", 0)
        self.sets: dict[str, dict[str, Any]] = dict(spec.get("sets", {}))
        self.flags: dict[str, list[str]] = dict(spec.get("flags", {}))
        self.code: int = spec.get("code", INVALID_SETTING)  # the exit code when it is invalid
        # Rendered into the deployment files (compose, k8s/, ci tools): another value at run time would
        # disagree with them, so it is refused unless a replaced server program runs outside them.
        self.rendered: str | None = spec.get("rendered")
        if "default" in spec:
            self.default: str | None = str(spec["default"]).format(**deployment)
        elif self.key in deployment:
            self.default = str(deployment[self.key])
        else:
            self.default = None  # secrets: unset means absent
        if self.kind not in KINDS or self.where not in WHERE:
            raise Problem(
                f"glm5.toml [setting.{name}]",
                f"kind {self.kind!r} / where {self.where!r} is not one of {KINDS} / {WHERE}",
                "correct the declaration",
            )

    def parse(self, raw: str, source: str | None = None) -> Any:
        """The value of `raw` for this setting; a Problem names the source (the variable by default)."""
        try:
            return self._parse(raw, source or self.name)
        except Problem as problem:
            problem.code = self.code
            raise

    def _parse(self, raw: str, where: str) -> Any:
        raw = raw.strip()
        bounds = f"{self.low}..{self.high}"
        if self.kind in ("int", "float"):
            if raw == "" and self.default == "":
                return None
            if self.kind == "int" and not re.fullmatch(r"[0-9]+", raw):
                raise Problem(where, f"{raw!r} is not a whole number", f"use a whole number in {bounds}")
            try:
                value: Any = int(raw) if self.kind == "int" else float(raw)
            except ValueError:
                value = math.nan
            if value != value:  # NaN: not a number at all
                raise Problem(where, f"{raw!r} is not a number", f"use a number in {bounds}")
            if not self.low <= value <= self.high:
                raise Problem(where, f"{raw!r} is out of range", f"use a value in {bounds}")
            return value
        if self.kind == "choice":
            if raw not in self.choices:
                raise Problem(where, f"{raw!r} is not a choice", f"use one of {', '.join(self.choices)}")
            return raw
        if self.kind == "path":
            if not raw.startswith("/"):
                raise Problem(
                    where, f"{raw!r} is not an absolute path", "use an absolute path inside the container"
                )
            return raw.rstrip("/") or "/"
        if self.kind == "name":
            if not NAME_FORM.fullmatch(raw):
                raise Problem(
                    where, f"{raw!r} is not a name", "use letters, digits and . _ / - (at most 128)"
                )
            return raw
        if self.kind == "args":
            import shlex

            try:
                return shlex.split(raw)
            except ValueError as err:
                raise Problem(
                    where, f"cannot split {raw!r} as shell words ({err})", "fix the quoting"
                ) from err
        if self.kind == "bool":
            if raw.lower() not in TRUE + FALSE:
                raise Problem(where, f"{raw!r} is not a yes/no value", "use 1 or 0")
            return raw.lower() in TRUE
        if self.kind == "checks":
            names = {n.strip() for n in raw.split(",") if n.strip()}
            if names == {"all"}:
                return set(self.choices)
            unknown = names - set(self.choices)
            if unknown:
                raise Problem(
                    where,
                    f"unknown check(s) {', '.join(sorted(unknown))}",
                    f"use a comma list of {', '.join(self.choices)}, or all",
                )
            return names
        return raw  # text, secret


def bound(raw: Any, deployment: Mapping[str, Any]) -> Any:
    """A bound as declared: a number, or "{key}" for a [deployment] value (the drain bound the grace periods
    are rendered for, say)."""
    return type(deployment[raw[1:-1]])(deployment[raw[1:-1]]) if isinstance(raw, str) else raw


def load_config(path: Path = CONFIG_PATH) -> dict[str, Any]:
    """glm5.toml, parsed once per process."""
    if path not in _LOADED:
        import tomllib  # costs a probe ~10 ms: only here

        with path.open("rb") as fh:
            _LOADED[path] = tomllib.load(fh)
    return _LOADED[path]


def declarations(config: Mapping[str, Any] | None = None) -> dict[str, Setting]:
    """Every [setting.NAME], each with the flag it owns: its own `flag` (a flag its `flags` emit), or the [[flag]]
    that names it as its `setting` (each option declared once: a second declaration is refused)."""
    config = config or load_config()
    found = {name: Setting(name, spec, config["deployment"]) for name, spec in config["setting"].items()}
    for flag in config["flag"]:
        name = flag.get("setting")
        if name is None:
            continue
        if name not in found or "value" in flag or found[name].flag is not None:
            raise Problem(
                f"glm5.toml [[flag]] {flag['name']}",
                f"setting = {name!r} is not a setting, or the flag also has a value, or the setting a flag",
                "declare the option once: [[flag]] with `setting` and no `value`; no `flag` in [setting.NAME]",
            )
        found[name].flag = flag["name"]
    return found


def secret_problem(setting: Setting, secret: str) -> Problem | None:
    """What is wrong with a secret's value, or None. SGLang reads its --config file back into argv (`--api-key VALUE`):
    a value that starts with '-' is read as a flag, and the server ends at its parser ("argument --admin-api-key:
    expected one argument", measured on the real 0.5.23)."""
    fix = f"use at least {setting.min_length} random characters (openssl rand -hex 24)"
    if len(secret) < setting.min_length:
        return Problem(setting.name, f"is {len(secret)} characters long", fix)
    if secret.startswith("-"):
        return Problem(setting.name, "starts with '-', which SGLang's parser reads as a flag", fix)
    return None


def read_secret(environ: Mapping[str, str], name: str) -> str | None:
    """VAR or VAR_FILE (docker/k8s secrets), never both; an unreadable or empty file is a Problem."""
    direct, file_var = environ.get(name, "").strip(), environ.get(f"{name}_FILE", "").strip()
    if direct and file_var:
        raise Problem(
            name, f"{name} and {name}_FILE are both set", f"keep one (prefer {name}_FILE for secrets)"
        )
    if not file_var:
        return direct or None
    try:
        value = Path(file_var).read_text().strip()
    except OSError as err:
        raise Problem(
            f"{name}_FILE", f"cannot read {file_var} ({err.strerror})", "mount the secret there"
        ) from err
    if not value:
        raise Problem(f"{name}_FILE", f"{file_var} is empty", "put the secret in it")
    return value


def resolve(
    environ: Mapping[str, str], config: Mapping[str, Any] | None = None, where: str = "container"
) -> dict[str, Any]:
    """The configuration values under `environ`, as read in the container (`where="container"`) or by the
    host-side tools (`where="ci"`, which also read the host settings); raises Problems."""
    config = config or load_config()
    values: dict[str, Any] = dict(config["deployment"])
    problems: list[Problem] = []
    decls = declarations(config)
    for setting in decls.values():
        try:
            if setting.kind == "secret":
                values[setting.key] = secret = read_secret(environ, setting.name)
                if secret is not None and (found := secret_problem(setting, secret)):
                    raise found
                continue
            if setting.default is None:
                raise Problem(
                    f"glm5.toml [setting.{setting.name}]", "has no default", f"add [deployment].{setting.key}"
                )
            values[setting.key] = setting.parse(
                setting.default, f"glm5.toml [setting.{setting.name}] default"
            )
            raw = environ.get(setting.name, "")
            if not raw.strip():
                continue
            if setting.where != "container" and where == "container":
                raise Problem(
                    setting.name,
                    f"is read by {READ_BY[setting.where]}, not inside the container: set here (glm5.env, the "
                    "pod's env) it would have no effect",
                    f"move it to {HOME_OF[setting.where]}",
                )
            value = setting.parse(raw)
            if (
                setting.rendered
                and where == "container"
                and value != values[setting.key]
                and not environ.get("GLM5_SERVER_PROGRAM", "").strip()
            ):
                raise Problem(
                    setting.name,
                    f"{raw.strip()} differs from {values[setting.key]}, the value rendered into {setting.rendered}",
                    f"unset it; to change it everywhere, edit [deployment].{setting.key} in entrypoint/glm5.toml, "
                    "run ci/render and rebuild",
                )
            values[setting.key] = value
        except Problem as problem:
            problems.append(problem)
    problems += unknown_or_removed(environ, decls, config.get("removed_setting", {}))
    if problems:
        raise Problems(problems)
    for setting in decls.values():
        values.update(setting.sets.get(str(values[setting.key]), {}))
    return values


def resolve_leniently(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[Problem]]:
    """The values and the problems `resolve` would raise, with every setting a problem names at its glm5.toml
    default and the others as set: what lets supervisord and the exporter run, and say why, under an invalid
    configuration (nothing is started with these values: preflight refuses them)."""
    try:
        return resolve(environ), []
    except Problems as err:
        problems = err.problems
    named = {problem.setting.split("=", 1)[0] for problem in problems}
    kept = {
        name: raw
        for name, setting in declarations().items()
        if (raw := environ.get(name, "")).strip() and name not in named and setting.kind != "secret"
    }
    try:
        return resolve(kept), problems
    except Problems:
        return resolve({}), problems


def unknown_or_removed(
    environ: Mapping[str, str], decls: Mapping[str, Setting], removed: Mapping[str, str]
) -> list[Problem]:
    known = set(decls) | {f"{n}_FILE" for n, s in decls.items() if s.kind == "secret"}
    problems = []
    for name in sorted(n for n in environ if n.startswith(PREFIX) and n not in known):
        if name in removed:
            problems.append(Problem(name, "was removed", removed[name]))
        else:
            import difflib

            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            problems.append(
                Problem(
                    name,
                    "is not a setting of glm5-serve",
                    f"{hint}see docs/reference.md's settings table (entrypoint/launch --reference), or unset it",
                )
            )
    return problems


READ_BY = {"host": "docker compose on the host", "ci": "the ci/ tools on the host"}
HOME_OF = {
    "host": ".env beside docker-compose.yml (cp .env.example .env), or the shell that runs docker compose",
    "ci": "the shell that runs the ci/ tool, or .env beside docker-compose.yml",
}
DOTENV_LINE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*")


def read_dotenv(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of a compose .env file (comments, blank lines, `export` and one level of matching
    quotes as compose reads them); a missing file is empty."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    values = {}
    for line in text.splitlines():
        m = DOTENV_LINE.fullmatch(line)
        if m is None or line.lstrip().startswith("#"):
            continue
        value = m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        values[m.group(1)] = value
    return values


def container_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less the settings read on the host: what a container started from it would see."""
    outside = {s.name for s in declarations().values() if s.where != "container"}
    return {k: v for k, v in environ.items() if k not in outside}


def host_environment(environ: Mapping[str, str], root: Path) -> dict[str, str]:
    """What the host-side tools read, as docker compose does: the kit's .env, then the shell, which wins."""
    return read_dotenv(root / ".env") | dict(environ)


def reference(config: Mapping[str, Any] | None = None) -> str:
    """docs/reference.md's settings table (markdown)."""
    rows = ["| variable | default | where | meaning |", "|---|---|---|---|"]
    for s in declarations(config).values():
        name = f"`{s.name}` / `{s.name}_FILE`" if s.kind == "secret" else f"`{s.name}`"
        default = "(unset)" if not s.default else f"`{s.default}`"
        rows.append(f"| {name} | {default} | {s.where} | {s.doc} |")
    return "\n".join(rows) + "\n"
