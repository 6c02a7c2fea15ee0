"""A scenario's [variants.launch] table as the launcher's LaunchSpec: the one translation shared by
`run`/`compare`, the smoke suite and bisect (which points the spec at each build it probes)."""

from __future__ import annotations

import sys

from itlaudit.model.scenario import LaunchConfig
from itlaudit.serve.launcher import LaunchSpec
from itlaudit.serve.testbed import default_cache_dir

__all__ = ["launch_spec"]


def _expand(text: str) -> str:
    """`{python}` is this interpreter, `{cache}` itlaudit's cache folder (testbed venvs, models):
    so a shipped scenario can name the testbed without knowing where this machine keeps it."""
    return text.replace("{python}", sys.executable).replace("{cache}", str(default_cache_dir()))


def launch_spec(config: LaunchConfig) -> LaunchSpec:
    def opt(value: str | None) -> str | None:
        return _expand(value) if value is not None else None

    return LaunchSpec(
        kind=config.kind,
        python=opt(config.python),
        image=config.image,
        command=[_expand(part) for part in config.command],
        model=opt(config.model),
        served_model_name=config.served_model_name,
        server_args=[_expand(arg) for arg in config.server_args],
        env=dict(config.env),
        ready_timeout_s=config.ready_timeout_s,
    )
