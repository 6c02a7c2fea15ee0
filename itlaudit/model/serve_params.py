"""Server parameters a sweep varies: the question a spec-decode engineer asks is "which K?", and the
answer differs with the load, so `sweep` grids server settings × load (issue 35 item 4), as `vllm bench
sweep` grids its serve-params. Given as `--serve-param NAME=V1,V2,...` (repeatable) or a scenario's
`[sweep.serve]` table (`num_speculative_tokens = [0, 1, 3]`); every setting is one launched server.

How a setting reaches the server's arguments:
- `num_speculative_tokens` and the other keys of vLLM's `--speculative-config` (or `speculative_config.X`
  for any key) are set inside that JSON argument, which the variant's launch must already carry (it
  names the method and its draft); `num_speculative_tokens = 0` removes the argument, so the K0
  server is "speculation off", the baseline a K sweep is read against — not "K=0 by a schedule";
- any other NAME is vLLM's flag `--NAME` (underscores as dashes), replaced where the launch gives it
  and added where it does not; `true` gives the bare flag and `false` removes it.
Pure (no I/O): the sweep workflow expands its scenario with `expand` before any server starts.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from itlaudit.errors import ScenarioError
from itlaudit.model.launch import LaunchKind, LaunchSpec

if TYPE_CHECKING:  # model.scenario reads [sweep.serve] through this module
    from itlaudit.model.scenario import Scenario, Variant

ServeValue = bool | int | float | str

# --speculative-config keys a sweep may name bare; `speculative_config.KEY` names any other.
SPECULATIVE_KEYS = frozenset(
    {
        "num_speculative_tokens",
        "method",
        "model",
        "prompt_lookup_max",
        "prompt_lookup_min",
        "draft_tensor_parallel_size",
        "rejection_sample_method",
        "synthetic_acceptance_length",
    }
)
_SPEC_PREFIX = "speculative_config."
_SPEC_FLAGS = ("--speculative-config", "--speculative_config")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_LABELS = {"num_speculative_tokens": "K"}  # the names a spec-decode engineer says


def _value(text: str) -> ServeValue:
    """A value as the JSON config or the command line takes it: an integer, a number, true/false, or
    the text itself (a method's name)."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_serve_param(text: str) -> tuple[str, list[ServeValue]]:
    """`NAME=V1,V2,...` (one --serve-param) as its name and values, or one line saying what is wrong."""
    name, eq, values = text.partition("=")
    name = name.strip().lstrip("-").replace("-", "_")
    items = [v.strip() for v in values.split(",")] if eq else []
    if not _NAME.fullmatch(name) or not items or any(not v for v in items):
        raise ScenarioError(
            f"--serve-param {text!r}: write NAME=V1,V2,... (e.g. num_speculative_tokens=0,1,3 or "
            "max_num_seqs=8,16)"
        )
    return name, _checked(name, [_value(v) for v in items], f"--serve-param {text!r}")


def serve_settings(table: Mapping[str, object], where: str) -> dict[str, list[ServeValue]]:
    """A scenario's [sweep.serve] table (NAME = [values]) checked as --serve-param checks its text."""
    params: dict[str, list[ServeValue]] = {}
    for name, values in table.items():
        listed = values if isinstance(values, list) else None
        if not _NAME.fullmatch(name) or not listed or not all(_is_value(v) for v in listed):
            raise ScenarioError(
                f"{where}: {name} = {values!r}: give a list of values, e.g. "
                "num_speculative_tokens = [0, 1, 3]"
            )
        params[name] = _checked(name, listed, where)
    return params


def _is_value(value: object) -> bool:
    return isinstance(value, bool | int | float | str)


def _checked(name: str, values: list[ServeValue], where: str) -> list[ServeValue]:
    if len(set(map(repr, values))) != len(values):
        raise ScenarioError(f"{where}: {name} repeats a value; give each once")
    if _spec_key(name) == "num_speculative_tokens" and any(
        isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values
    ):
        raise ScenarioError(
            f"{where}: num_speculative_tokens takes whole numbers from 0 (0: speculation off)"
        )
    return values


def _spec_key(name: str) -> str | None:
    """The --speculative-config key a parameter sets, or None for a server flag."""
    if name.startswith(_SPEC_PREFIX):
        return name.removeprefix(_SPEC_PREFIX)
    return name if name in SPECULATIVE_KEYS else None


def setting_label(setting: Mapping[str, ServeValue]) -> str:
    """A setting as a variant name's tail: "K3", "max_num_seqs=16", "K3-max_num_seqs=16"."""
    words = []
    for name, value in setting.items():
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        label = _LABELS.get(_spec_key(name) or name)
        words.append(f"{label}{shown}" if label else f"{name}={shown}")
    return "-".join(words)


def _flag_span(args: Sequence[str], names: Sequence[str]) -> tuple[int, int] | None:
    """Where a flag sits in an argv: (start, end) covering `--x v` or `--x=v`, or None."""
    for at, arg in enumerate(args):
        name, eq, _ = arg.partition("=")
        if name in names:
            takes_next = not eq and at + 1 < len(args) and not args[at + 1].startswith("--")
            return at, at + (2 if takes_next else 1)
    return None


def _set_flag(args: list[str], names: Sequence[str], value: list[str] | None) -> list[str]:
    """argv with the flag replaced by `value` (its words), added at the end, or removed (None)."""
    span = _flag_span(args, names)
    if span is None:
        return args if value is None else [*args, *value]
    return [*args[: span[0]], *(value or []), *args[span[1] :]]


def apply_setting(launch: LaunchSpec, setting: Mapping[str, ServeValue], variant: str) -> LaunchSpec:
    """The launch with a setting's parameters in its arguments (the module's docstring says how)."""
    command_kind = launch.kind is LaunchKind.COMMAND
    args = list(launch.command if command_kind else launch.server_args)
    config: dict[str, Any] | None = launch.speculative_config
    for name, value in setting.items():
        key = _spec_key(name)
        if key is None:
            flag = "--" + name.replace("_", "-")
            words = [flag] if value is True else None if value is False else [flag, str(value)]
            args = _set_flag(args, [flag, "--" + name], words)
            continue
        if config is None:
            if key == "num_speculative_tokens" and value == 0:
                continue  # speculation already off
            raise ScenarioError(
                f"--serve-param {name}: variant {variant!r} has no --speculative-config in its launch "
                "arguments to set it in; give it one with the method (and draft) to sweep"
            )
        config = {**config, key: value}
    if config is not None:
        off = config.get("num_speculative_tokens") == 0
        words = None if off else [_SPEC_FLAGS[0], json.dumps(config, separators=(",", ":"))]
        args = _set_flag(args, _SPEC_FLAGS, words)
    if command_kind:
        return dataclasses.replace(launch, command=args)
    return dataclasses.replace(launch, server_args=args)


def expand(
    scenario: Scenario, names: Sequence[str], params: Mapping[str, Sequence[ServeValue]]
) -> tuple[Scenario, dict[str, dict[str, ServeValue]]]:
    """The scenario with each chosen variant (`names`, in order) replaced by one variant per setting
    of the grid (the product of the parameters' values, in the order given), named `<variant>-<label>`
    ("ngram-K3"), and each new variant's setting. Every chosen variant must be launched: a server given
    by URL cannot be restarted with other arguments."""
    grid = [dict(zip(params, combo, strict=True)) for combo in itertools.product(*params.values())]
    chosen = {v.name: v for v in scenario.variants if v.name in names}
    settings: dict[str, dict[str, ServeValue]] = {}
    variants: list[Variant] = []
    for name in names:
        variant = chosen[name]
        if variant.launch is None:
            raise ScenarioError(
                f"--serve-param needs servers itlaudit launches: variant {name!r} is given by URL; give "
                "it a [variants.launch] table"
            )
        for setting in grid:
            new = f"{name}-{setting_label(setting)}"
            launch = apply_setting(variant.launch, setting, name)
            variants.append(dataclasses.replace(variant, name=new, launch=launch))
            settings[new] = {"variant": name, **setting}
    return dataclasses.replace(scenario, variants=variants), settings
