"""A scenario's [variants.launch] table as the launcher gets it: placeholders filled in. The one
translation shared by `run`/`compare`, the smoke suite and bisect (which points the spec at each build
it probes)."""

from __future__ import annotations

import dataclasses
import sys

from itlaudit.model.launch import LaunchSpec
from itlaudit.serve.testbed import default_cache_dir


def _expand(text: str) -> str:
    """`{python}` is this interpreter, `{cache}` itlaudit's cache folder (testbed venvs, models):
    so a shipped scenario can name the testbed without knowing where this machine keeps it."""
    return text.replace("{python}", sys.executable).replace("{cache}", str(default_cache_dir()))


def launch_spec(config: LaunchSpec) -> LaunchSpec:
    """`config` with `{python}` and `{cache}` filled in wherever a path or an argument may hold them."""

    def opt(value: str | None) -> str | None:
        return _expand(value) if value is not None else None

    return dataclasses.replace(
        config,
        python=opt(config.python),
        command=[_expand(part) for part in config.command],
        model=opt(config.model),
        server_args=[_expand(arg) for arg in config.server_args],
        env=dict(config.env),
    )
