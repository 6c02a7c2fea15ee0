"""The memory-bandwidth floor (analysis.roofline, issue 35 item 6): each family's bytes per decode
step against a hand count from its config.json, the device table, and the floor said in every output
of a run on the simulator. CI cost: ~12 s (three simulated runs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import faultkit
import pytest
from simkit import itlaudit, sim_server

from itlaudit.analysis.roofline import bandwidth_for, model_bytes, variant_floor
from itlaudit.model.meta import Roofline
from itlaudit.serve.launcher import local_model_config
from itlaudit.serve.sim import SimConfig

GEMMA = Path.home() / ".cache" / "itlaudit" / "models" / "gemma3-270m" / "config.json"
LLAMA = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 256,
    "dtype": "bfloat16",
}  # fmt: skip  (the testbed's tiny Llama)


def test_a_dense_model_reads_its_layers_its_head_and_one_embedding_row() -> None:
    """The tiny Llama: per layer q and o 128·2·64 each, k and v 128·1·64 each (49,152), the MLP 3·128·256
    (98,304); the head 512·128 and one embedding row 128: 360,576 parameters, 2 bytes each. Its KV: 2
    layers × 2 (k, v) × 1 head × 64 per token, 2 bytes."""
    model = model_bytes(LLAMA)
    assert model.weight_bytes == 2 * (2 * (49_152 + 98_304) + 512 * 128 + 128)
    assert model.kv_bytes(100) == 100 * 2 * 2 * 64 * 2
    assert model.step_bytes(100, batch=4) == model.weight_bytes + 4 * model.kv_bytes(100)
    assert (
        model_bytes({**LLAMA, "model_type": "mimo"}).weight_bytes == model.weight_bytes
    )  # MiMo: Qwen2's body
    fp8 = model_bytes({**LLAMA, "quantization_config": {"quant_method": "fp8"}})
    assert fp8.weight_bytes == model.weight_bytes / 2 and fp8.kv_bytes(100) == model.kv_bytes(100)
    assert model_bytes({**LLAMA, "quantization_config": {"bits": 4}}).weight_bytes == model.weight_bytes / 4


def test_gemma3_caps_its_sliding_layers_kv_at_the_window() -> None:
    """Gemma 3 270M (the GPU lane's model, its config.json from the testbed's build): 18 layers of q, o
    640·4·256 and k, v 640·256 (1,638,400) and MLP 3·640·2048 (3,932,160), the tied head 262,144·640 read
    in full: 268,042,880 parameters, 536 MB a step in bf16; 15 sliding layers keep 512 tokens of KV, 3
    full ones all of it."""
    config = json.loads(GEMMA.read_text()) if GEMMA.exists() else None
    if config is None:
        pytest.skip("the testbed's Gemma 3 is built by `itlaudit testbed build-model --which gemma`")
    model = model_bytes(config)
    assert model.weight_bytes == 2 * (18 * (1_638_400 + 3_932_160) + 262_144 * 640 + 640)
    per_layer_token = 2 * 1 * 256 * 2  # k and v, one head of 256, bf16
    assert model.kv_bytes(2000) == per_layer_token * (3 * 2000 + 15 * 512)
    assert model.kv_bytes(100) == per_layer_token * 18 * 100


def test_a_mixture_of_experts_reads_its_active_experts_and_mla_its_latent() -> None:
    """Qwen3-MoE: per layer attention 64·4·16·2 + 64·2·16·2 (12,288), 2 of 8 experts 3·64·32 each
    (12,288 each) and the router 64·8; DeepSeek-V3: MLA with q_lora, its first layer dense, one shared
    expert, the cache the latent and the rotary key (32 + 8 per token per layer)."""
    moe = {
        "model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32,
        "num_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 999, "dtype": "bfloat16",
    }  # fmt: skip
    per_layer = 12_288 + 2 * 3 * 64 * 32 + 64 * 8
    assert model_bytes(moe).weight_bytes == 2 * (2 * per_layer + 100 * 64 + 64)
    deepseek = {
        "model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100,
        "num_attention_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 32, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "dtype": "bfloat16",
    }  # fmt: skip
    attention = 64 * 16 + 16 * 4 * 24 + 64 * 40 + 32 * 4 * 32 + 4 * 16 * 64
    dense, routed = 3 * 64 * 128, 3 * 64 * 32
    expected = 2 * attention + dense + (2 * routed + routed + 64 * 8) + 100 * 64 + 64
    model = model_bytes(deepseek)
    assert model.weight_bytes == 2 * expected and model.kv_bytes(10) == 10 * 2 * (32 + 8) * 2


def test_a_hybrid_reads_its_linear_layers_state_not_a_growing_cache() -> None:
    """Qwen3-Next / Qwen3.6's hybrid: one full (gated) attention layer in 4; the other three are Gated
    DeltaNet, whose float32 state (value heads × key dim × value dim) is read every step whatever the
    context. A text_config (the multimodal checkpoint) is read for its language model."""
    hybrid = {
        "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 100,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "full_attention_interval": 4,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
        "linear_value_head_dim": 8, "intermediate_size": 128, "dtype": "bfloat16",
    }  # fmt: skip
    full = 64 * 4 * 16 * 3 + 2 * 64 * 2 * 16
    linear = 64 * (2 * 16 + 2 * 32 + 2 * 4) + 32 * 64
    mlp = 3 * 64 * 128
    model = model_bytes({"model_type": "qwen3_5", "text_config": hybrid, "dtype": "bfloat16"})
    assert model.weight_bytes == 2 * (full + 3 * linear + 4 * mlp + 100 * 64 + 64)
    assert model.kv_bytes(10) == 10 * 2 * 2 * 16 * 2  # the one full layer
    assert model.state_bytes == 3 * 4 * 8 * 8 * 4


def test_the_device_table_and_the_floor_said_or_why_not() -> None:
    assert bandwidth_for("NVIDIA GB10").gbps == 273.0  # type: ignore[union-attr]
    assert bandwidth_for("NVIDIA H100 80GB HBM3").gbps == 3350.0  # type: ignore[union-attr]
    assert bandwidth_for("NVIDIA H100 PCIe").gbps == 2000.0  # type: ignore[union-attr]
    assert bandwidth_for("NVIDIA H200").gbps == 4800.0  # type: ignore[union-attr]
    assert bandwidth_for("Intel Xeon") is None and bandwidth_for(None) is None
    # the seed's arithmetic: 2.06 GB a token on GB10's 273 GB/s is a 7.5 ms floor; 10 ms is 75 %
    seed = variant_floor(Roofline(bytes_per_token=2.06e9), "NVIDIA GB10", 1000, 1, 10.0)
    assert seed["floor_ms"] == pytest.approx(7.546, abs=0.001) and seed["floor_share"] == pytest.approx(
        0.7546, abs=1e-3
    )
    assert (
        "give --mem-bandwidth"
        in variant_floor(Roofline(bytes_per_token=1e9), "Intel Xeon", 1, 1, 1.0)["floor_note"]
    )
    assert variant_floor(Roofline(), "NVIDIA H200", 1, 1, 1.0) == {}
    assert (
        "hidden_size"
        in variant_floor(Roofline(model_config={}, mem_bandwidth_gbps=10), None, 1, 1, 1.0)["floor_note"]
    )


def test_a_run_says_its_floor_in_every_output(tmp_path: Path) -> None:
    """--model-config with --mem-bandwidth on a simulated server: summary.json's server block, the
    terminal block, report.md and the --save-result file say the same floor."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    with sim_server(SimConfig(step_ms=2.0, ttft_ms=2.0)) as url:
        done = itlaudit(
            "run", "--url", url, "--num-prompts", "2", "--random-input-len", "16", "--random-output-len", "8",
            "--max-concurrency", "1", "--model-config", str(config), "--mem-bandwidth", "0.5",
            "--out", str(tmp_path / "run"), "--no-plots", "--save-result", str(tmp_path / "result.json"),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    server = json.loads((tmp_path / "run" / "summary.json").read_text())["server"]["server"]
    expected = model_bytes(LLAMA).step_bytes(server["floor_context_tokens"], 1) / 0.5e9 * 1e3
    assert server["floor_ms"] == pytest.approx(expected) and server["floor_batch"] == 1
    assert server["floor_bandwidth_source"] == "given (--mem-bandwidth)"
    assert "Floor per K0 token (ms):" in done.stdout and f"{server['floor_ms']:.3f}" in done.stdout
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"of the device's bandwidth floor {server['floor_ms']:.3g} ms" in report
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["floor_ms"] == server["floor_ms"] and saved["floor_share"] == server["floor_share"]


def test_a_launched_models_own_config_gives_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --model-config: a launched server's model folder (or its Hugging Face cache snapshot for a
    hub name) has the config.json; with a bandwidth the floor comes of it, and without one (no NVML
    here) the run says nothing about a floor it was not asked for. ~6 s (two launched simulators)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA))
    assert local_model_config(str(model)) == LLAMA
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(LLAMA))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert local_model_config("org/tiny") == LLAMA and local_model_config("org/other") is None
    command = json.dumps([sys.executable, "-m", "itlaudit", "sim", "--port", "{port}", "--step-ms", "2"])
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        'name = "floor"\nendpoint = "completions"\n[workload]\nprompts = ["hello there"]\nnum_requests = 2\n'
        'max_tokens = 8\nignore_eos = true\n[[variants]]\nname = "K0"\n[variants.launch]\nkind = "command"\n'
        f'model = "{model}"\ncommand = {command}\n'
    )
    for out, flags in (("given", ["--mem-bandwidth", "0.5"]), ("none", [])):
        done = faultkit.itlaudit(
            "run", str(scenario), "--out", str(tmp_path / out), "--no-plots", *flags, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
    server = json.loads((tmp_path / "given" / "summary.json").read_text())["server"]["K0"]
    assert server["floor_bytes_per_step"] == model_bytes(LLAMA).step_bytes(server["floor_context_tokens"], 1)
    quiet = json.loads((tmp_path / "none" / "summary.json").read_text())["server"]["K0"]
    assert not {k for k in quiet if k.startswith("floor")}
