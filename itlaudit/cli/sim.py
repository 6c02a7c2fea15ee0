"""`itlaudit sim`: serve the vLLM-compatible simulator, every fault of its catalogue a flag."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeAlias

import typer

from itlaudit.cli.options import choices
from itlaudit.serve.sim.config import DIALECTS, DRAFT_SAMPLERS, MODEL, VLLM

if TYPE_CHECKING:
    from itlaudit.serve.sim import SimConfig

    DraftSampler: TypeAlias = str
    Dialect: TypeAlias = str
else:
    DraftSampler = choices("DraftSampler", DRAFT_SAMPLERS)
    Dialect = choices("Dialect", DIALECTS)

_SHOWN = {"model", "num_speculative_tokens", "step_ms", "ttft_ms"}  # named first, given or not


def sim(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    model: Annotated[str, typer.Option(help="Served model name.")] = "sim-tiny",
    num_speculative_tokens: Annotated[
        int, typer.Option(help="K: draft tokens per step (0 = no spec decode).")
    ] = 0,
    acceptance_prob: Annotated[float, typer.Option(help="Per-position draft acceptance probability.")] = 1.0,
    step_ms: Annotated[float, typer.Option(help="Engine step time in ms.")] = 5.0,
    ttft_ms: Annotated[float, typer.Option(help="Prefill time in ms.")] = 20.0,
    seed: Annotated[int, typer.Option(help="RNG seed for tokens and acceptance.")] = 0,
    default_max_tokens: Annotated[
        int | None, typer.Option(help="Cap for requests that omit max_tokens.")
    ] = None,
    cap_tokens: Annotated[int | None, typer.Option(help="Fault: stop every request at N tokens.")] = None,
    ignore_stop_token_ids: Annotated[
        bool, typer.Option("--ignore-stop-token-ids", help="Fault: ignore stop_token_ids.")
    ] = False,
    drop_ignore_eos: Annotated[
        bool, typer.Option("--drop-ignore-eos", help="Fault: drop ignore_eos (stop at the natural EOS).")
    ] = False,
    ignore_min_tokens: Annotated[
        bool, typer.Option("--ignore-min-tokens", help="Fault: ignore min_tokens.")
    ] = False,
    drop_usage: Annotated[bool, typer.Option("--drop-usage", help="Fault: send no usage in chunks.")] = False,
    error_after_tokens: Annotated[int | None, typer.Option(help="Fault: error frame after N tokens.")] = None,
    reset_after_tokens: Annotated[
        int | None, typer.Option(help="Fault: reset the connection after N tokens.")
    ] = None,
    omit_done: Annotated[bool, typer.Option("--omit-done", help="Fault: omit data: [DONE].")] = False,
    natural_eos_at: Annotated[
        int | None, typer.Option(help="Token position where the model emits EOS.")
    ] = None,
    gibberish_after_tokens: Annotated[
        int | None, typer.Option(help="Fault: only digit tokens from position N on.")
    ] = None,
    send_log: Annotated[
        Path | None, typer.Option(help="On exit, write each streamed chunk's due and send time here (JSON).")
    ] = None,
    batch_slowdown_ms_per_stream: Annotated[
        float, typer.Option(help="Load: ms added to each step per concurrent request beyond the first.")
    ] = 0.0,
    spec_verify_ms_per_stream: Annotated[
        float, typer.Option(help="Load: with K>0, ms more per request beyond the first (verify cost).")
    ] = 0.0,
    model_sharpness: Annotated[
        float,
        typer.Option(
            help="Model: 0 draws tokens uniformly; above 0 from a fixed bigram model this sharp, at the "
            "request's temperature, with prompt_logprobs answered from it."
        ),
    ] = 0.0,
    draft_sampler: Annotated[
        DraftSampler,
        typer.Option(
            help="Fault (K>0, --model-sharpness > 0): draw accepted drafts as argmax or flat, not from "
            "the model: spec decode that changes the distribution at temperature > 0.",
        ),
    ] = MODEL,
    max_num_seqs: Annotated[
        int | None,
        typer.Option(help="Scheduler: requests beyond N wait (vllm:num_requests_waiting)."),
    ] = None,
    kv_cache_tokens: Annotated[
        int, typer.Option(help="Scheduler: KV-cache size in tokens (vllm:kv_cache_usage_perc, preemptions).")
    ] = 65536,
    per_request_spec_metrics: Annotated[
        bool,
        typer.Option(
            "--per-request-spec-decode-metrics",
            help="With K>0, metrics.speculative_decoding on the final usage chunk, as vLLM 0.32's flag.",
        ),
    ] = False,
    spec_metrics_lie: Annotated[
        bool,
        typer.Option("--spec-metrics-lie", help="Fault: the per-request block claims every draft."),
    ] = False,
    dialect: Annotated[
        Dialect,
        typer.Option(
            help="Whose wire: vLLM 0.32's, or SGLang's (no /version but /server_info, the native "
            "/generate stream, sglang:* metrics, its OpenAI layout).",
        ),
    ] = VLLM,
    sglang_continuous_usage: Annotated[
        bool,
        typer.Option(
            "--sglang-continuous-usage",
            help="With --dialect sglang: honour stream_options.continuous_usage_stats (else usage only "
            "in the last chunk, as SGLang builds without it send).",
        ),
    ] = False,
    sglang_incremental_output: Annotated[
        bool,
        typer.Option(
            "--sglang-incremental-output",
            help="With --dialect sglang: /generate streams each step's text and output_ids, not all so "
            "far (SGLang's --incremental-streaming-output).",
        ),
    ] = False,
    speculative_config: Annotated[
        str | None,
        typer.Option(
            metavar="JSON",
            help="vLLM's argument, so a launch line can be a vLLM one: its num_speculative_tokens is K.",
        ),
    ] = None,
) -> None:
    """Serve the vLLM-compatible simulator (demo and fault-injection target; not a test of vLLM)."""
    from itlaudit.serve.sim import SimConfig, serve

    config = SimConfig(
        model=model,
        num_speculative_tokens=_k(speculative_config, num_speculative_tokens),
        acceptance_prob=acceptance_prob,
        step_ms=step_ms,
        ttft_ms=ttft_ms,
        seed=seed,
        default_max_tokens=default_max_tokens,
        cap_tokens=cap_tokens,
        ignore_stop_token_ids=ignore_stop_token_ids,
        ignore_ignore_eos=drop_ignore_eos,
        ignore_min_tokens=ignore_min_tokens,
        drop_usage=drop_usage,
        error_after_tokens=error_after_tokens,
        reset_after_tokens=reset_after_tokens,
        no_done=omit_done,
        natural_eos_at=natural_eos_at,
        gibberish_after_tokens=gibberish_after_tokens,
        batch_slowdown_ms_per_stream=batch_slowdown_ms_per_stream,
        spec_verify_ms_per_stream=spec_verify_ms_per_stream,
        model_sharpness=model_sharpness,
        draft_sampler=str(draft_sampler),
        max_num_seqs=max_num_seqs,
        kv_cache_tokens=kv_cache_tokens,
        per_request_spec_metrics=per_request_spec_metrics,
        spec_metrics_lie=spec_metrics_lie,
        dialect=str(dialect),
        sglang_continuous_usage=sglang_continuous_usage,
        sglang_incremental_output=sglang_incremental_output,
    )
    # Said before the server is up (and flushed: a log or pipe sees it at once), so the seconds a start
    # takes are not silent and the log names what this simulator was told to do.
    print(f"itlaudit sim: {_settings(config)}; starting on http://{host}:{port}", flush=True)
    serve(config, host=host, port=port, send_log_path=send_log)


def _k(speculative_config: str | None, given: int) -> int:
    """K from vLLM's --speculative-config (a sweep sets it there, model.serve_params), else the flag."""
    if speculative_config is None:
        return given
    try:
        k = json.loads(speculative_config).get("num_speculative_tokens")
    except (ValueError, AttributeError):
        k = None
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise typer.BadParameter(
            "a JSON object with num_speculative_tokens, a whole number", param_hint="--speculative-config"
        )
    return k


def _settings(config: SimConfig) -> str:
    """The model, its timing, and every setting given that differs from the default (the faults)."""
    given = [
        f"{f.name}={getattr(config, f.name)}"
        for f in dataclasses.fields(config)
        if f.name not in _SHOWN and getattr(config, f.name) != f.default
    ]
    timing = (
        f"model {config.model}, K={config.num_speculative_tokens}, step {config.step_ms:g} ms, "
        f"TTFT {config.ttft_ms:g} ms"
    )
    return timing + (f"; {', '.join(given)}" if given else "; no faults")
