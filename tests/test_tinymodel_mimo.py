"""The tiny MiMo checkpoint (itlaudit/serve/tinymodel.py --arch mimo) against what vLLM's MTP loader expects.

The first test needs no torch: it replays, over the checkpoint's tensor names and shapes (the
safetensors header of the model that was served on the H200, tests/fixtures/tiny-mimo-cuda-h200/),
the name mapping of vLLM 0.24.0's models/mimo_mtp.py (MiMoMTP.map_model_name_to_mtp_param_name and
load_weights' stacking) and models/mimo.py (the target skips mtp_layers), and requires that every
parameter of both modules is loaded exactly once with the right merged shape -- vLLM's default loader
refuses a checkpoint that leaves a parameter unloaded. The parameter lists below are written out from
those files' module definitions, not from the builder, so a builder that drifts from vLLM fails here.

The vllm-marked tests rebuild the model with the testbed's torch (byte-identical to the fixture) and
serve it on vLLM CPU with {"method": "mtp"}: a real engine loading the head and accepting part of it.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import urllib.request
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-mimo-cuda-h200"
TINYMODEL = Path(__file__).parents[1] / "itlaudit" / "serve" / "tinymodel.py"


def _config() -> dict:
    return json.loads((FIXTURE / "config.json").read_text())


def _header() -> dict[str, list[int]]:
    return {k: v["shape"] for k, v in json.loads((FIXTURE / "safetensors-header.json").read_text()).items()}


def _qwen2_layer_params(prefix: str, c: dict) -> dict[str, list[int]]:
    """vLLM models/qwen2.py Qwen2DecoderLayer: QKVParallelLinear(bias=True), o_proj/gate_up/down without
    bias, two RMSNorms. head_dim = hidden_size // num_attention_heads (Qwen2Attention)."""
    h, heads, kv, inter = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["intermediate_size"],
    )
    hd = h // heads
    return {
        f"{prefix}self_attn.qkv_proj.weight": [(heads + 2 * kv) * hd, h],
        f"{prefix}self_attn.qkv_proj.bias": [(heads + 2 * kv) * hd],
        f"{prefix}self_attn.o_proj.weight": [h, heads * hd],
        f"{prefix}mlp.gate_up_proj.weight": [2 * inter, h],
        f"{prefix}mlp.down_proj.weight": [h, inter],
        f"{prefix}input_layernorm.weight": [h],
        f"{prefix}post_attention_layernorm.weight": [h],
    }


def _mtp_params(c: dict) -> dict[str, list[int]]:
    """MiMoMTP under SpeculativeConfig.hf_config_override (num_hidden_layers set to 0, so the MTP layer
    index starts at 0): model.embed_tokens, model.mtp_layers.<i>.{token,hidden,final}_layernorm,
    input_proj Linear(2h, h), mtp_block = Qwen2DecoderLayer; lm_head."""
    h, v = c["hidden_size"], c["vocab_size"]
    params = {"model.embed_tokens.weight": [v, h], "lm_head.weight": [v, h]}
    for i in range(c["num_nextn_predict_layers"]):
        p = f"model.mtp_layers.{i}."
        params |= {
            p + "token_layernorm.weight": [h],
            p + "hidden_layernorm.weight": [h],
            p + "final_layernorm.weight": [h],
            p + "input_proj.weight": [h, 2 * h],
        }
        params |= _qwen2_layer_params(p + "mtp_block.", c)
    return params


def _target_params(c: dict) -> dict[str, list[int]]:
    """MiMoForCausalLM = Qwen2ForCausalLM (untied lm_head) with MiMoModel's loader skipping mtp_layers."""
    h, v = c["hidden_size"], c["vocab_size"]
    params = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
    for i in range(c["num_hidden_layers"]):
        params |= _qwen2_layer_params(f"model.layers.{i}.", c)
    return params


_STACKED = [
    ("qkv_proj", "q_proj"),
    ("qkv_proj", "k_proj"),
    ("qkv_proj", "v_proj"),
    ("gate_up_proj", "gate_proj"),
    ("gate_up_proj", "up_proj"),
]


def _mtp_load(name: str) -> str | None:
    """MiMoMTP.load_weights' routing of one checkpoint name (None: skipped)."""
    m = re.match(r"(model\.mtp_layers\.)(\d+)(\.)", name)
    if m:  # + num_hidden_layers, which the override sets to 0
        name = name.replace(m.group(), f"{m.group(1)}{int(m.group(2)) + 0}.")
    if not any(s in name for s in ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm")):
        m = re.match(r"(model\.mtp_layers\.\d+\.)", name)
        if m:
            name = name.replace(m.group(), m.group() + "mtp_block.")
    for param, weight in _STACKED:
        if weight in name:
            return name.replace(weight, param) if "mtp_layers" in name else None
    if "mtp_layers" not in name and "embed_tokens" not in name and "lm_head" not in name:
        return None
    return name


def _target_load(name: str) -> str | None:
    if "mtp_layers" in name:
        return None
    for param, weight in _STACKED:
        if weight in name:
            return name.replace(weight, param)
    return name


def _merged_shapes(header: dict[str, list[int]], route) -> dict[str, list[int]]:
    """Stacked shards concatenate along dim 0 (QKVParallelLinear / MergedColumnParallelLinear)."""
    merged: dict[str, list[int]] = {}
    for name, shape in header.items():
        target = route(name)
        if target is None:
            continue
        if target in merged and target != name:
            merged[target] = [merged[target][0] + shape[0], *shape[1:]]
        else:
            assert target not in merged, f"{name} loaded twice into {target}"
            merged[target] = list(shape)
    return merged


def test_config_selects_mimo_and_its_mtp_head() -> None:
    c = _config()
    # speculative.py: hf_config.architectures[0] == "MiMoForCausalLM" -> model_type mimo_mtp, n_predict
    # = num_nextn_predict_layers; num_speculative_tokens 3 must be a multiple of it.
    assert c["architectures"] == ["MiMoForCausalLM"]
    assert c["num_nextn_predict_layers"] == 1 and 3 % c["num_nextn_predict_layers"] == 0
    assert c["model_type"] == "qwen2"  # loads without trust_remote_code
    assert c["tie_word_embeddings"] is False
    assert c["hidden_size"] // c["num_attention_heads"] == 64  # FA3 and the CPU kernel accept 64


def test_every_mtp_and_target_parameter_loads_exactly_once_with_its_shape() -> None:
    c, header = _config(), _header()
    assert _merged_shapes(header, _mtp_load) == _mtp_params(c)
    assert _merged_shapes(header, _target_load) == _target_params(c)


def test_a_missing_mtp_weight_is_caught() -> None:
    """The check above can fail: drop one shard and the merged qkv shape no longer matches."""
    c, header = _config(), _header()
    del header["model.mtp_layers.0.self_attn.k_proj.bias"]
    assert _merged_shapes(header, _mtp_load) != _mtp_params(c)


def _read_header(path: Path) -> dict[str, list[int]]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return {k: v["shape"] for k, v in json.loads(raw[8 : 8 + n]).items() if k != "__metadata__"}


@pytest.fixture(scope="module")
def built_mimo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from vllm_server import testbed_python

    python = testbed_python()
    out = tmp_path_factory.mktemp("mimo") / "tiny-mimo-s0"
    subprocess.run(
        [str(python), "-P", str(TINYMODEL), str(out), "--arch", "mimo"], check=True, capture_output=True
    )
    return python, out


@pytest.mark.vllm
def test_built_checkpoint_matches_the_fixture_and_the_head_reads_only_the_embedding(built_mimo) -> None:
    python, out = built_mimo
    assert _read_header(out / "model.safetensors") == _header()
    assert json.loads((out / "config.json").read_text()) == _config()
    probe = (
        "import sys, torch; from safetensors.torch import load_file\n"
        "t = load_file(sys.argv[1] + '/model.safetensors'); p = 'model.mtp_layers.0.'\n"
        "w = t[p + 'input_proj.weight'].float(); h = w.shape[0]\n"
        "assert torch.equal(w[:, :h], torch.zeros(h, h)) and torch.equal(w[:, h:], torch.eye(h))\n"
        "assert not t[p + 'self_attn.o_proj.weight'].any() and not t[p + 'mlp.down_proj.weight'].any()\n"
        "assert t['model.layers.0.self_attn.o_proj.weight'].any()\n"
        "print('ok')\n"
    )
    result = subprocess.run([str(python), "-c", probe, str(out)], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr


@pytest.mark.vllm
def test_vllm_serves_the_mtp_head_with_partial_acceptance(built_mimo, tmp_path: Path) -> None:
    from vllm_server import BASE_ARGS, ENV, READY_TIMEOUT_S, SERVED_MODEL

    from itlaudit.model.launch import LaunchSpec
    from itlaudit.serve.launcher import launch

    python, out = built_mimo
    spec = LaunchSpec(
        kind="python",
        python=str(python),
        model=str(out),
        served_model_name=SERVED_MODEL,
        server_args=[*BASE_ARGS, "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}'],
        env=dict(ENV),
        ready_timeout_s=READY_TIMEOUT_S,
    )
    with launch(spec, tmp_path / "server.log") as server:
        body = json.dumps(
            {
                "model": SERVED_MODEL,
                "prompt": "The quick brown fox jumps over the lazy dog",
                "max_tokens": 128,
                "temperature": 0,
                "ignore_eos": True,
            }
        ).encode()
        req = urllib.request.Request(
            f"{server.url}/v1/completions", body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert json.load(resp)["usage"]["completion_tokens"] == 128
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    log = (tmp_path / "server.log").read_text()
    assert "MiMoMTPModel" in log

    def total(metric: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(metric + "{")
        )

    drafts = total("vllm:spec_decode_num_draft_tokens_total")
    accepted = total("vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0
    assert 0 < accepted < drafts  # the embedding-path head agrees with the target sometimes, not always
