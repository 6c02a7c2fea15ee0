"""The simulator's settings: its model, its timing, and the catalogue of faults it can inject."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from itlaudit import __version__
from itlaudit.model.run_context import SIMULATOR, simulator_version

# Where the simulator's accepted draft tokens come from (SimConfig.draft_sampler).
MODEL = "model"  # the model: lossless, as speculative sampling must be
ARGMAX = "argmax"  # fault: the model's argmax, a greedy drafter's token taken as is
FLAT = "flat"  # fault: uniform over the vocabulary
DRAFT_SAMPLERS = (MODEL, ARGMAX, FLAT)

# Whose wire the simulator speaks (SimConfig.dialect): vLLM 0.32's, or SGLang's (serve/sim/sglang.py).
VLLM = "vllm"
SGLANG = "sglang"
DIALECTS = (VLLM, SGLANG)

# What /version answers: the simulator by name, never a vLLM version, so a run against it is recorded
# as simulated (meta.json, the ledger, the report) and cannot pass for a real build.
SIM_VERSION = simulator_version()


@dataclass
class SimConfig:
    """Server behaviour and injected faults; all faults are off by default."""

    model: str = "sim-tiny"
    num_speculative_tokens: int = 0
    acceptance_prob: float = 1.0
    step_ms: float = 5.0
    ttft_ms: float = 20.0
    seed: int = 0
    eos_token_id: int = 2
    vocab_size: int = 512
    max_model_len: int = 2048
    default_max_tokens: int | None = None
    # Injected faults.
    cap_tokens: int | None = None
    ignore_stop_token_ids: bool = False
    ignore_ignore_eos: bool = False
    ignore_min_tokens: bool = False
    drop_usage: bool = False
    error_after_tokens: int | None = None
    reset_after_tokens: int | None = None
    no_done: bool = False
    natural_eos_at: int | None = None
    # Fault: from this token position on, emit only a digit piece, like the late numeric gibberish of
    # a broken decode path (seed 003) — the stream itself stays well-formed.
    gibberish_after_tokens: int | None = None
    # Fault: a request's logprobs move by up to this much (nats) whenever another row shares its engine
    # step (a multi-prompt list or a concurrent request), deterministically per step composition, like
    # the batch variance of real kernels (seed 000). The sampled tokens do not change.
    batch_variance: float = 0.0
    # Load: each engine row beyond the first adds this much to every step (a batch is not free), and
    # with spec decode on, this much more (verifying a row's drafts costs compute). Past the batch size
    # where K extra verify rows cost more than the accepted drafts save, K>0 loses per token to K=0:
    # what `itlaudit sweep` must find. Both 0 by default: a step takes step_ms at any concurrency.
    batch_slowdown_ms_per_stream: float = 0.0
    spec_verify_ms_per_stream: float = 0.0
    # Model: 0 draws tokens uniformly (every output equally likely); above 0 tokens follow a fixed
    # bigram distribution this sharp (lm.BigramModel), at the request's temperature, and the
    # completions endpoint answers prompt_logprobs from it, so output likelihood can be audited.
    model_sharpness: float = 0.0
    # Fault (with model_sharpness > 0 and K > 0): accepted draft tokens come from the wrong
    # distribution (ARGMAX or FLAT of DRAFT_SAMPLERS) while the bonus token and K=0 follow the model:
    # speculative sampling that is not lossless at temperature > 0.
    draft_sampler: str = MODEL
    # Scheduler (serve/sim/load.py): rows beyond max_num_seqs wait for a seat (None: no limit), and
    # /metrics shows KV usage against kv_cache_tokens, as vLLM's gauges do.
    max_num_seqs: int | None = None
    kv_cache_tokens: int = 65536
    # vLLM's --per-request-spec-decode-metrics (summary): with K > 0, the final usage chunk carries
    # metrics.speculative_decoding. Fault: spec_metrics_lie reports every draft accepted.
    per_request_spec_metrics: bool = False
    spec_metrics_lie: bool = False
    # Whose wire: vLLM's, or SGLang's (no /version, /server_info, /generate, sglang:* metrics, its
    # OpenAI layout). sglang_continuous_usage: an SGLang build that honours
    # stream_options.continuous_usage_stats; without it usage comes only in the last chunk.
    # sglang_incremental_output: SGLang's --incremental-streaming-output, /generate's stream sending
    # each step's text, ids and output logprobs instead of all of them so far.
    dialect: str = VLLM
    sglang_continuous_usage: bool = False
    sglang_incremental_output: bool = False

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("draft_sampler", self.draft_sampler, DRAFT_SAMPLERS),
            ("dialect", self.dialect, DIALECTS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")

    @property
    def system_fingerprint(self) -> str:
        """Stable per configuration, shaped like vLLM's ``vllm-<version>-<hash8>`` but naming the
        simulator: ``itlaudit-sim-<itlaudit version>-<hash8>``."""
        return f"{SIMULATOR}-{__version__}-{zlib.crc32(repr(self).encode()):08x}"
