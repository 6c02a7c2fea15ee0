"""The memory-bandwidth floor of a decode step: what the hardware allows, beside what was measured.

Decoding at low batch is bound by memory bandwidth: each engine step reads every weight it uses once
(shared by the batch) and each sequence's KV cache, and produces one token per sequence without
speculation. So `bytes read per step / bandwidth` is the fastest a step can be, and a K0 token ITL can
be said as a share of it: the seed's Qwen3.6-35B-A3B checkpoint moves ~2.06 GB per token, 7.5 ms on
GB10's 273 GB/s, so "~10 ms" is ~75 % of the roofline and "~72 ms" ~10 %. A speculative variant
makes several tokens per step and may beat the K0 floor; that is said, not flagged.

The bytes come from the model's config.json (pure arithmetic here, no I/O): the parameters a decode
step reads (attention and MLP per layer; a mixture of experts' active experts, shared experts and
router only; the LM head in full; one embedding row) times the bytes per parameter (the dtype, or the
quantization's bits), plus the KV cache at the run's mean context (per layer that keeps one: MLA's
compressed latent, a sliding window's cap, none for linear-attention layers, whose fixed state is
read instead). Norms, biases and convolution kernels are left out (well under 1 %).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from itlaudit.model.codes import LAUNCH_BOUND, Finding
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.meta import Roofline


@dataclass(frozen=True)
class Bandwidth:
    """A device's peak memory bandwidth, and where the figure comes from."""

    gbps: float  # GB/s, 1e9 bytes
    source: str


# NVML's device names, matched by the first entry whose every word is in the name (lower case), with
# the makers' published peak bandwidth. The H100's SXM part reports itself as "H100 80GB HBM3".
BANDWIDTHS: tuple[tuple[tuple[str, ...], Bandwidth], ...] = (
    (("gb10",), Bandwidth(273.0, "NVIDIA DGX Spark datasheet: GB10, 128 GB LPDDR5x, 273 GB/s")),
    (("h200",), Bandwidth(4800.0, "NVIDIA H200 datasheet: 141 GB HBM3e, 4.8 TB/s")),
    (("h100", "nvl"), Bandwidth(3900.0, "NVIDIA H100 NVL datasheet: 94 GB HBM3, 3.9 TB/s")),
    (("h100", "pcie"), Bandwidth(2000.0, "NVIDIA H100 PCIe datasheet: 80 GB HBM2e, 2.0 TB/s")),
    (("h100",), Bandwidth(3350.0, "NVIDIA H100 SXM datasheet: 80 GB HBM3, 3.35 TB/s")),
    (("b200",), Bandwidth(8000.0, "NVIDIA B200 (DGX B200 datasheet): 180 GB HBM3e, 8 TB/s per GPU")),
    (
        ("rtx", "pro", "6000", "blackwell"),
        Bandwidth(1792.0, "NVIDIA RTX PRO 6000 Blackwell datasheet: 96 GB GDDR7, 1792 GB/s"),
    ),
    (("rtx", "5090"), Bandwidth(1792.0, "NVIDIA GeForce RTX 5090 specifications: 32 GB GDDR7, 1792 GB/s")),
)


def bandwidth_for(device: str | None) -> Bandwidth | None:
    """The table's bandwidth for an NVML device name; None for a device it does not know."""
    if not device:
        return None
    words = device.lower()
    for needed, bandwidth in BANDWIDTHS:
        if all(word in words for word in needed):
            return bandwidth
    return None


@dataclass(frozen=True)
class KvLayers:
    """Layers that keep a KV cache of the same shape: elements per context token each, how many, and
    the context they keep (a sliding window), None for all of it."""

    elements: float
    count: int
    window: int | None = None


@dataclass(frozen=True)
class ModelBytes:
    """What one decode step reads for the served model: the weights once, and per sequence its KV
    cache (kv_bytes of the context) and any fixed recurrent state."""

    family: str
    weight_bytes: float
    kv_layers: tuple[KvLayers, ...]
    kv_bytes_per_element: float
    state_bytes: float  # per sequence: linear attention's recurrent state, read every step

    def kv_bytes(self, context_tokens: float) -> float:
        """One sequence's KV cache read at `context_tokens` of context."""
        elements = sum(
            layer.elements * layer.count * min(context_tokens, layer.window or context_tokens)
            for layer in self.kv_layers
        )
        return elements * self.kv_bytes_per_element

    def step_bytes(self, context_tokens: float, batch: int = 1) -> float:
        return self.weight_bytes + batch * (self.kv_bytes(context_tokens) + self.state_bytes)


# A variant's floor figures as its summary.json server block holds them (numbers, the bandwidth's
# source, the family, the device, or a note why there is none).
FloorFigures = dict[str, float | str | None]


def decode_floor(
    model: ModelBytes, bandwidth: Bandwidth, context_tokens: float, batch: int = 1
) -> FloorFigures:
    """The floor for a K0 token at `batch` sequences of `context_tokens` context: the step's bytes over
    the bandwidth, in ms (one token per sequence per step)."""
    step = model.step_bytes(context_tokens, batch)
    return {
        "floor_ms": step / (bandwidth.gbps * 1e9) * 1e3,
        "floor_bytes_per_step": step,
        "floor_weight_bytes": model.weight_bytes,
        "floor_context_tokens": context_tokens,
        "floor_batch": batch,
        "floor_bandwidth_gbps": bandwidth.gbps,
        "floor_bandwidth_source": bandwidth.source,
        "floor_family": model.family,
    }


# A checkpoint's config.json as read: its keys differ by model family, so it stays JSON, and every
# value is narrowed (a number, a list, a table) where it is read.
ModelConfig = Mapping[str, object]

_DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8_e4m3fn": 1.0}


def _bytes_per_parameter(config: ModelConfig) -> float:
    """The dtype's bytes, or the quantization's bits over 8 (fp8 checkpoints: 1; 4-bit GPTQ/AWQ: 0.5;
    MXFP4 and NVFP4, ModelOpt's quant_algo included: 0.5, their block scales and the layers they leave
    unquantized left out)."""
    quant = config.get("quantization_config")
    if isinstance(quant, Mapping):
        bits = quant.get("bits") or quant.get("weight_bits")
        if isinstance(bits, int | float) and bits > 0:
            return float(bits) / 8
        method = str(quant.get("quant_method") or "").lower()
        algo = str(quant.get("quant_algo") or "").lower()  # ModelOpt checkpoints (NVIDIA's NVFP4/FP8)
        if method in ("fp8", "fbgemm_fp8") or algo == "fp8":
            return 1.0
        if method in ("mxfp4", "nvfp4") or algo in ("nvfp4", "w4a16_awq", "w4a8_awq"):
            return 0.5
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").removeprefix("torch.")
    return _DTYPE_BYTES.get(dtype, 2.0)


def _number(config: ModelConfig, key: str, default: float | None = None) -> float:
    value = config.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"config.json has no number {key!r}")
    return float(value)


def _count(config: ModelConfig, key: str) -> float:
    """A number the config may leave out or null: 0 then."""
    value = config.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _text_config(config: ModelConfig) -> ModelConfig:
    """A multimodal checkpoint's language model (Gemma 3, Qwen3.5/3.6): its text_config, the dtype
    and quantization of the whole kept where the text part does not say them."""
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        return config
    inherited = {k: config[k] for k in ("torch_dtype", "dtype", "quantization_config") if k in config}
    return {**inherited, **text}


def _mlp(config: ModelConfig, hidden: float, moe: bool) -> float:
    """One layer's MLP parameters a token reads: gate, up and down projections; for a mixture of
    experts the routed experts a token uses, the shared experts and the router."""
    if not moe:
        return 3 * hidden * _number(config, "intermediate_size")
    expert = 3 * hidden * _number(config, "moe_intermediate_size")
    active = _number(config, "num_experts_per_tok")
    experts = _count(config, "num_experts") or _count(config, "n_routed_experts")
    shared = 0.0
    if isinstance(size := config.get("shared_expert_intermediate_size"), int | float):
        shared = 3 * hidden * float(size)
    elif isinstance(count := config.get("n_shared_experts"), int | float):
        shared = float(count) * expert
    return active * expert + shared + hidden * experts


def _is_moe(config: ModelConfig) -> bool:
    return isinstance(config.get("moe_intermediate_size"), int | float) and bool(
        config.get("num_experts") or config.get("n_routed_experts")
    )


def _layer_types(config: ModelConfig, layers: int) -> Sequence[str]:
    """Each layer's attention: "full_attention", "sliding_attention" or "linear_attention", from
    layer_types, or the hybrid's interval (Qwen3-Next: one full layer in full_attention_interval)."""
    named = config.get("layer_types")
    if isinstance(named, list) and len(named) == layers:
        return [str(kind) for kind in named]
    interval = config.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    pattern = config.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0 and config.get("sliding_window"):
        return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    return ["full_attention"] * layers


def model_bytes(raw: ModelConfig) -> ModelBytes:
    """The decode step's bytes for a config.json (see the module docstring); ValueError naming the key
    a config lacks. The config is JSON as a checkpoint ships it (its keys differ by family): every value
    is narrowed where it is read."""
    config = _text_config(raw)
    family = str(config.get("model_type") or raw.get("model_type") or "unknown")
    hidden = _number(config, "hidden_size")
    layers = int(_number(config, "num_hidden_layers"))
    vocab = _number(config, "vocab_size")
    heads = _number(config, "num_attention_heads")
    per_parameter = _bytes_per_parameter(config)
    if isinstance(config.get("kv_lora_rank"), int | float):
        attention, kv = _mla(config, hidden, heads)
        kv_layers: tuple[KvLayers, ...] = (KvLayers(kv, layers),)
        linear, state = 0.0, 0.0
        kinds: Sequence[str] = ["full_attention"] * layers
    else:
        kv_heads = _number(config, "num_key_value_heads", heads)
        head_dim = _number(config, "head_dim", hidden / heads)
        kinds = _layer_types(config, layers)
        # the hybrids' full attention gates its output: the query projection is twice as wide
        gated = bool(config.get("attn_output_gate")) or "linear_attention" in kinds
        attention = hidden * heads * head_dim * (3 if gated else 2) + 2 * hidden * kv_heads * head_dim
        window = found if isinstance(found := config.get("sliding_window"), int) else None
        full = sum(1 for kind in kinds if kind == "full_attention")
        sliding = sum(1 for kind in kinds if kind == "sliding_attention")
        kv_layers = tuple(
            KvLayers(2 * kv_heads * head_dim, count, cap)
            for count, cap in ((full, None), (sliding, window))
            if count
        )
        linear, state = _linear_attention(config, hidden)
    dense_first = int(first) if isinstance(first := config.get("first_k_dense_replace"), int | float) else 0
    dense = config.get("mlp_only_layers")
    dense_layers = {i for i in dense if isinstance(i, int)} if isinstance(dense, list) else set()
    dense_layers |= set(range(dense_first))
    moe = _is_moe(config)
    weights = 0.0
    for index, kind in enumerate(kinds):
        weights += linear if kind == "linear_attention" else attention
        weights += _mlp(config, hidden, moe and index not in dense_layers)
    weights += vocab * hidden + hidden  # the LM head in full (tied or not), one embedding row
    linear_layers = sum(1 for kind in kinds if kind == "linear_attention")
    return ModelBytes(
        family=family,
        weight_bytes=weights * per_parameter,
        kv_layers=kv_layers,
        # the cache in the model's activation dtype (vLLM's default kv_cache_dtype "auto"): an fp8 or
        # 4-bit checkpoint still caches bf16
        kv_bytes_per_element=4.0 if per_parameter == 4.0 else 2.0,
        state_bytes=state * linear_layers,
    )


def _mla(config: ModelConfig, hidden: float, heads: float) -> tuple[float, float]:
    """DeepSeek-V3's multi-head latent attention: its projections' parameters, and the elements per
    token its cache keeps (the compressed latent and the rotary key)."""
    rope, nope = _number(config, "qk_rope_head_dim"), _number(config, "qk_nope_head_dim")
    value, latent = _number(config, "v_head_dim"), _number(config, "kv_lora_rank")
    q_rank = config.get("q_lora_rank")
    if isinstance(q_rank, int | float) and q_rank:
        query = hidden * q_rank + q_rank * heads * (nope + rope)
    else:
        query = hidden * heads * (nope + rope)
    keys_values = hidden * (latent + rope) + latent * heads * (nope + value)
    return query + keys_values + heads * value * hidden, latent + rope


def _linear_attention(config: ModelConfig, hidden: float) -> tuple[float, float]:
    """A Gated DeltaNet layer (Qwen3-Next, Qwen3.5/3.6): its projections' parameters (q, k, v, the
    output gate z, the b and a gates, the output), and its recurrent state's bytes per sequence (one
    key-by-value matrix per value head, in float32)."""
    if not isinstance(config.get("linear_num_value_heads"), int | float):
        return 0.0, 0.0
    keys = _number(config, "linear_num_key_heads") * _number(config, "linear_key_head_dim")
    value_heads, value_dim = (
        _number(config, "linear_num_value_heads"),
        _number(config, "linear_value_head_dim"),
    )
    key_dim = _number(config, "linear_key_head_dim")
    values = value_heads * value_dim
    projections = hidden * (2 * keys + 2 * values + 2 * value_heads) + values * hidden
    return projections, value_heads * key_dim * value_dim * 4.0


GIVEN_BANDWIDTH = "given (--mem-bandwidth)"
GIVEN_BYTES = "given (--bytes-per-token)"


def variant_floor(
    roofline: Roofline,
    device: str | None,
    context_tokens: float,
    batch: int,
    itl_p50_ms: float | None,
) -> FloorFigures:
    """One variant's floor for summary.json's server block, from meta.json's `roofline` (the config
    as read, a given bandwidth or bytes per token), the device NVML named, the run's mean context and
    batch, and its token ITL p50: `floor_share` is floor / ITL (1 is the roofline; above 1 only a
    variant that makes several tokens a step, speculation, can reach). Empty where nothing was given;
    `floor_note` (one line) where the floor cannot be had."""
    config, given_gbps, given_bytes = (
        roofline.model_config,
        roofline.mem_bandwidth_gbps,
        roofline.bytes_per_token,
    )
    if config is None and given_bytes is None:
        return {}
    if given_gbps is not None:
        bandwidth: Bandwidth | None = Bandwidth(given_gbps, GIVEN_BANDWIDTH)
    else:
        bandwidth = bandwidth_for(device)
    if bandwidth is None:
        named = f"device {device!r}" if device else "a device NVML did not name"
        return {"floor_note": f"no memory bandwidth known for {named}: give --mem-bandwidth GBPS"}
    if given_bytes is not None:
        model = ModelBytes(GIVEN_BYTES, given_bytes, (), 2.0, 0.0)
    else:
        try:
            model = model_bytes(config or {})
        except ValueError as exc:
            return {"floor_note": f"no floor: {exc}"}
    figures = decode_floor(model, bandwidth, context_tokens, batch)
    figures["floor_device"] = device
    if itl_p50_ms and isinstance(floor := figures["floor_ms"], float):
        figures["floor_share"] = floor / itl_p50_ms
    return figures


# A step this far from the floor, on a GPU this idle, is not waiting on memory (issue 35 item 8: the
# GPU lane's eager Gemma 3 270M ran 33 ms a token against a 0.1 ms floor with NVML at 12-25 %).
LAUNCH_BOUND_SHARE = 0.10
LAUNCH_BOUND_UTIL_PCT = 50.0


def launch_bound_finding(variant: str, server: Mapping[str, object]) -> Finding | None:
    """launch_bound for a variant whose token ITL p50 is under LAUNCH_BOUND_SHARE of its floor's speed
    while NVML's utilisation p50 is under LAUNCH_BOUND_UTIL_PCT: neither memory nor compute is the
    limit, kernel launches or the host CPU are (eager mode, CUDA graphs off, a small model), so a
    ratio against another variant measures the host as much as the server. Needs both figures."""
    share, util, floor = server.get("floor_share"), server.get("gpu_util_p50_pct"), server.get("floor_ms")
    if (
        not isinstance(share, int | float)
        or not isinstance(util, int | float)
        or not isinstance(floor, int | float)
    ):
        return None
    if share >= LAUNCH_BOUND_SHARE or util >= LAUNCH_BOUND_UTIL_PCT:
        return None
    itl = floor / share
    message = (
        f"Variant {variant!r}: token ITL p50 {itl:.3g} ms is {share:.2%} of the memory-bandwidth floor's "
        f"speed ({floor:.3g} ms a step) while NVML saw the GPU busy {util:.0f}% of the time (p50): the step "
        "waits on kernel launches or the CPU, not on the GPU (eager mode? CUDA graphs off?). Its speed "
        "moves with the host: compare repeated trials (--trials), not one ratio."
    )
    evidence: JSONObject = {
        "variant": variant,
        "token_itl_p50_ms": itl,
        "floor_ms": floor,
        "floor_share": share,
        "gpu_util_p50_pct": util,
    }
    return Finding.of(LAUNCH_BOUND, message, evidence)
