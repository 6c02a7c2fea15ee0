"""Smoke suites: a folder of ordinary scenario TOMLs plus `suite.toml` (servers, launch, checks).

Everything is validated before any server starts, because a typo found after a 50 s (CPU) or
several-minute (35B on DGX Spark) server start is the most expensive kind. A check that names an
unknown finding code is an error, not a silent pass.
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from itlaudit.analysis.findings import CODES
from itlaudit.analysis.metrics import SUMMARY_METRICS
from itlaudit.errors import SuiteError
from itlaudit.model.codes import ACCEPTANCE_LENGTH_MISMATCH
from itlaudit.model.launch import READY_TIMEOUT_S, LaunchKind, LaunchSpec, launch_kind_problem
from itlaudit.model.scenario import Scenario, load_scenario

SUITE_FILE = "suite.toml"
STATS = ("mean", "p50", "p90", "p99")
FINDING_CODES = (*CODES, ACCEPTANCE_LENGTH_MISMATCH)
DEFAULT_METRIC = "itl_ms.p50"

_COMMON_KEYS = {"kind", "scenario", "variant", "name"}
# kind → (allowed threshold keys, required ones)
CHECK_KEYS: dict[str, tuple[set[str], set[str]]] = {
    "completion_tokens": ({"equals", "min", "max"}, set()),
    "finish_reason": ({"equals"}, {"equals"}),
    "no_finding": ({"codes"}, {"codes"}),
    "metric": ({"metric", "min", "max"}, {"metric"}),
    "speedup": ({"metric", "over", "min", "gibberish_expected"}, {"min"}),
    "acceptance_length": ({"min"}, {"min"}),
    # the token ITL's share of the memory-bandwidth floor (analysis.roofline): physics, not a past run
    "bandwidth_floor": ({"min"}, {"min"}),
    "baseline": ({"metric", "max_ratio"}, {"max_ratio"}),
}
_LAUNCH_KEYS = {"kind", "python", "image", "command", "model", "served_model_name", "env", "ready_timeout_s"}


@dataclass(frozen=True)
class ServerSpec:
    """One server the suite's scenarios run on (K0, K3): its own args on top of the suite's launch."""

    name: str
    server_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


class CheckParams(msgspec.Struct, frozen=True, kw_only=True):
    """A [[checks]] table's thresholds (CHECK_KEYS says which a kind takes); None: not given."""

    equals: int | str | None = None
    min: int | float | None = None
    max: int | float | None = None
    codes: list[str] = msgspec.field(default_factory=list)
    metric: str | None = None
    over: str | None = None
    max_ratio: int | float | None = None
    gibberish_expected: bool = False


@dataclass(frozen=True)
class CheckSpec:
    """One [[checks]] table; scenario/variant None mean every scenario / every variant."""

    kind: str
    params: CheckParams
    scenario: str | None = None
    variant: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    description: str
    launch: LaunchSpec | None
    servers: list[ServerSpec]
    scenarios: list[Scenario]
    checks: list[CheckSpec]

    def scenario(self, name: str) -> Scenario:
        return next(s for s in self.scenarios if s.name == name)


def _fail(path: Path, where: str, problem: str) -> SuiteError:
    return SuiteError(f"{path}: {where} {problem}")


def _typed(path: Path, where: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise _fail(path, where, f"must be {names}, got {type(value).__name__} {value!r}")
    return value


def _str_list(path: Path, where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, where, "must be a list of strings")
    return value


def _str_dict(path: Path, where: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _fail(path, where, "must be a table of strings (quote numbers)")
    return value


def _unknown(path: Path, where: str, src: Mapping[str, object], allowed: set[str]) -> None:
    for key in src:
        if key not in allowed:
            raise _fail(
                path, f"{where}: `{key}`", f"is not a known key (known: {', '.join(sorted(allowed))})"
            )


def _launch(path: Path, src: Any) -> LaunchSpec:
    where = "[launch]"
    _typed(path, where, src, dict)
    _unknown(path, where, src, _LAUNCH_KEYS)
    kind = _typed(path, f"{where} `kind`", src.get("kind"), str)
    problem = launch_kind_problem(kind)
    if problem is not None:
        raise _fail(path, f"{where} `kind`", problem)
    optional = {
        key: _typed(path, f"{where} `{key}`", src[key], str)
        for key in ("python", "image", "model")
        if key in src
    }
    timeout = _typed(
        path, f"{where} `ready_timeout_s`", src.get("ready_timeout_s", READY_TIMEOUT_S), (int, float)
    )
    return LaunchSpec(
        kind=LaunchKind(kind),
        command=_str_list(path, f"{where} `command`", src.get("command", [])),
        served_model_name=src.get("served_model_name"),
        env=_str_dict(path, f"{where} `env`", src.get("env", {})),
        ready_timeout_s=float(timeout),
        **optional,
    )


def _servers(path: Path, src: Any) -> list[ServerSpec]:
    if not isinstance(src, dict) or not src:
        raise _fail(path, "[servers]", "is missing; add a [servers.K0] table (and [servers.K3], ...)")
    out = []
    for name, table in src.items():
        where = f"[servers.{name}]"
        _typed(path, where, table, dict)
        _unknown(path, where, table, {"server_args", "env"})
        out.append(
            ServerSpec(
                name=name,
                server_args=_str_list(path, f"{where} `server_args`", table.get("server_args", [])),
                env=_str_dict(path, f"{where} `env`", table.get("env", {})),
            )
        )
    return out


def _metric(path: Path, where: str, value: Any) -> str:
    text: str = _typed(path, where, value, str)
    metric, _, stat = text.partition(".")
    if metric not in SUMMARY_METRICS or stat not in STATS:
        raise _fail(
            path,
            where,
            f"must be METRIC.STAT with METRIC one of {', '.join(SUMMARY_METRICS)} and STAT one of "
            f"{', '.join(STATS)}, got {value!r}",
        )
    return text


def _check(path: Path, index: int, src: Any, scenarios: dict[str, Scenario]) -> CheckSpec:
    where = f"[[checks]] #{index}"
    _typed(path, where, src, dict)
    kind = _typed(path, f"{where} `kind`", src.get("kind"), str)
    if kind not in CHECK_KEYS:
        raise _fail(
            path, f"{where} `kind`", f"is {kind!r}, not a known check (known: {', '.join(CHECK_KEYS)})"
        )
    allowed, required = CHECK_KEYS[kind]
    _unknown(path, f"{where} ({kind})", src, allowed | _COMMON_KEYS)
    missing = sorted(required - set(src))
    if missing:
        raise _fail(path, f"{where} ({kind})", f"needs `{missing[0]}`")
    scenario = src.get("scenario")
    variant = src.get("variant")
    if scenario is not None and scenario not in scenarios:
        raise _fail(
            path, f"{where} `scenario`", f"is {scenario!r}, not in the suite ({', '.join(scenarios)})"
        )
    targets = [scenarios[scenario]] if scenario is not None else list(scenarios.values())
    names = {v.name for s in targets for v in s.variants}
    if variant is not None and variant not in names:
        raise _fail(
            path, f"{where} `variant`", f"is {variant!r}, not a variant of {scenario or 'any scenario'}"
        )
    params = {k: v for k, v in src.items() if k not in _COMMON_KEYS}
    for key in ("min", "max", "max_ratio"):
        if key in params:
            _typed(path, f"{where} `{key}`", params[key], (int, float))
    if "gibberish_expected" in params:
        _typed(path, f"{where} `gibberish_expected`", params["gibberish_expected"], bool)
    if "metric" in params:
        _metric(path, f"{where} `metric`", params["metric"])
    if kind == "metric" and not {"min", "max"} & set(params):
        raise _fail(path, f"{where} (metric)", "needs `min` or `max`")
    if kind == "no_finding":
        codes = _str_list(path, f"{where} `codes`", params["codes"])
        unknown = [c for c in codes if c not in FINDING_CODES]
        if unknown or not codes:
            raise _fail(
                path, f"{where} `codes`", f"names unknown codes {unknown} (known: {', '.join(FINDING_CODES)})"
            )
    if kind == "finish_reason":
        _typed(path, f"{where} `equals`", params["equals"], str)
    if kind == "completion_tokens":
        for key in ("equals", "min", "max"):
            if key in params:
                _typed(path, f"{where} `{key}`", params[key], int)
        if not params and any(s.workload.params.max_tokens is None for s in targets):
            raise _fail(
                path, where, "(completion_tokens) needs `equals`/`min`/`max`: a scenario has no max_tokens"
            )
    if kind == "speedup":
        over = params.setdefault("over", targets[0].variants[0].name)
        if not all(over in {v.name for v in s.variants} for s in targets):
            raise _fail(
                path, f"{where} `over`", f"is {over!r}, not a variant of every scenario it applies to"
            )
    try:
        typed = msgspec.convert(params, CheckParams)
    except msgspec.ValidationError as exc:
        raise _fail(path, f"{where} ({kind})", f"has a value of the wrong type ({exc})") from None
    return CheckSpec(kind=kind, params=typed, scenario=scenario, variant=variant, name=src.get("name"))


def _suite_file(path: Path) -> Path:
    if path.is_dir():
        found = path / SUITE_FILE
        if not found.is_file():
            inner = sorted(p.parent.name for p in path.glob(f"*/{SUITE_FILE}"))
            hint = f" (suites inside: {', '.join(str(path / n) for n in inner)})" if inner else ""
            raise SuiteError(f"{path}: no {SUITE_FILE} here{hint}; pass --suite DIR holding {SUITE_FILE}")
        return found
    if not path.is_file():
        raise SuiteError(f"{path}: suite not found; pass --suite DIR holding {SUITE_FILE}")
    return path


def load_suite(path: Path) -> Suite:
    """The suite in a folder (or its suite.toml): every scenario loaded, every check resolved."""
    file = _suite_file(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{file}: cannot read suite ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{file}: not valid TOML: {exc}") from None
    _unknown(file, "top level", raw, {"name", "description", "launch", "servers", "checks"})
    scenarios: dict[str, Scenario] = {}
    for scenario_path in sorted(file.parent.glob("*.toml")):
        if scenario_path.name == SUITE_FILE:
            continue
        scenario = load_scenario(scenario_path)
        if scenario.name in scenarios:
            raise SuiteError(f"{scenario_path}: scenario name {scenario.name!r} is used twice in the suite")
        scenarios[scenario.name] = scenario
    if not scenarios:
        raise SuiteError(f"{file.parent}: the suite holds no scenario TOML next to {SUITE_FILE}")
    servers = _servers(file, raw.get("servers"))
    declared = {s.name for s in servers}
    for scenario in scenarios.values():
        missing = [v.name for v in scenario.variants if v.name not in declared]
        if missing:
            raise SuiteError(
                f"{scenario.path}: variants {', '.join(missing)} are not servers of the suite "
                f"({', '.join(sorted(declared))}); add [servers.NAME] to {file}"
            )
    checks_src = raw.get("checks", [])
    if not isinstance(checks_src, list) or not checks_src:
        raise _fail(file, "[[checks]]", "is missing; a suite without checks cannot say go or no-go")
    return Suite(
        name=_typed(file, "`name`", raw.get("name", file.parent.name), str),
        path=file,
        description=_typed(file, "`description`", raw.get("description", ""), str),
        launch=_launch(file, raw["launch"]) if "launch" in raw else None,
        servers=servers,
        scenarios=list(scenarios.values()),
        checks=[_check(file, i, src, scenarios) for i, src in enumerate(checks_src, 1)],
    )


def parse_launch_option(text: str) -> tuple[LaunchKind, str | list[str]]:
    """`python:PATH`, `docker:IMAGE` or `command:CMD ARGS...` → (kind, value)."""
    kind, sep, value = text.partition(":")
    if not sep or not value or launch_kind_problem(kind) is not None:
        raise SuiteError(f"--launch {text!r}: expected python:PATH, docker:IMAGE or command:CMD ARGS...")
    return LaunchKind(kind), shlex.split(value) if kind == LaunchKind.COMMAND else value


def server_launch(
    suite: Suite, server: ServerSpec, launch: str | None = None, model: str | None = None
) -> LaunchSpec | None:
    """The suite's launch, overridden by --launch/--model, plus this server's args and env.

    A `command` launch gets the server's args appended, so one base command (vLLM's CLI, or the
    simulator) serves every server of the suite.
    """
    base = suite.launch
    if launch is not None:
        kind, value = parse_launch_option(launch)
        keep = base if base is not None and base.kind == kind else LaunchSpec(kind=kind)
        if base is not None:
            keep = replace(
                keep,
                served_model_name=base.served_model_name,
                env=base.env,
                model=base.model,
                ready_timeout_s=base.ready_timeout_s,
            )
        if isinstance(value, list):
            base = replace(keep, kind=kind, command=value)
        elif kind == LaunchKind.DOCKER:
            base = replace(keep, kind=kind, image=value)
        else:
            base = replace(keep, kind=kind, python=value)
    if base is None:
        return None
    if model is not None:
        base = replace(base, model=model)
    if base.kind == LaunchKind.COMMAND:
        return replace(base, command=[*base.command, *server.server_args], env={**base.env, **server.env})
    return replace(base, server_args=[*base.server_args, *server.server_args], env={**base.env, **server.env})
