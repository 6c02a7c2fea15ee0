"""Build a tiny random-weight Llama or MiMo, or a Llama that thinks (plus tokenizer), that a real vLLM
server can load.

No model can be downloaded on a testbed, yet the auditor needs a real engine to produce real wire
traffic, so the model is synthesised locally. It is deliberately useless as a language model: only its
shape matters (small enough to decode in milliseconds on two cores, large enough that vLLM's CPU
attention kernel accepts it: head_dim 64, since 16 is rejected).

This module imports torch/transformers/tokenizers, which live only in the testbed venv; it is run as a
script by that venv's python (``python -P itlaudit/serve/tinymodel.py OUT_DIR``, where -P keeps itlaudit/
off sys.path so its subpackages cannot shadow stdlib modules; or ``python -m itlaudit.serve.tinymodel``) and
must never be imported by the rest of itlaudit. It is self-contained for the same reason: run by file
path, it cannot import its own package.

``--arch mimo`` writes a MiMo checkpoint (Qwen2 body, ``architectures: ["MiMoForCausalLM"]``, one MTP
layer under ``model.mtp_layers.0``): the smallest architecture whose multi-token-prediction head vLLM
loads with ``{"method": "mtp"}`` (vLLM 0.24's config/speculative.py maps MiMoForCausalLM to
MiMoMTPModel; models/mimo_mtp.py names the weights, see ``MTP_LAYER_WEIGHTS``). DeepSeek-V3's MTP needs
MLA and Qwen3-Next's needs gated delta-net layers, both far larger machinery for the same wire traffic.

A random MTP head would guess the target's next token about once in the vocabulary size, so acceptance
would be ~0 and the run would say nothing about partial acceptance. The head is instead built to
predict the target's *embedding path*: its decoder block adds nothing (zero output projections), its
input projection keeps only the next token's embedding, so its logits are lm_head(norm(embed(token)))
-- the target's own logits with the target's layers left out. The target's layers are scaled by
``RESIDUAL_SCALE`` so they move its choice only sometimes: the head then agrees with the target often
but not always, as a trained MTP head does.

``--arch think`` writes a Llama made to think: its tokenizer carries ``<think>`` and ``</think>`` as
added, non-special tokens (as Qwen3's does, so they reach the text and vLLM's ``--reasoning-parser
qwen3`` finds them by token id), and greedy decoding, whatever the chat prompt, follows one fixed walk:
``<think>``, the ``THINKING`` tokens, ``</think>``, then the ``ANSWER`` tokens round and round. A
random model never closes its thinking, so every reply would be reasoning only and the time to the
first answer token (TTFA) could never be measured; a trained thinking model cannot be downloaded here.
The answer repeats rather than ending in EOS so that every reply runs to its max_tokens with or without
ignore_eos (which vllm bench's random dataset sets), as the random Llama's do: a cap before
``</think>`` is a reply capped while thinking, any cap past it a reply with an answer.
The walk is the MTP head's trick taken one step further: the layers add nothing to the residual stream
(zero output projections), so the stream at each position is the current token's embedding alone, and
the embeddings and lm_head are a next-token table (``_set_walk``). The build checks the walk with the
model before it writes anything.

Output is byte-deterministic for a given (arch, seed, draft_noise): weights come from an explicit
``torch.Generator`` rather than transformers' init code (which changes between releases), and the BPE
tokenizer is trained on the fixed corpus below.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the testbed venv's packages: names for the annotations only, never imported at run time
    from tokenizers import Tokenizer
    from torch import Tensor
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

HIDDEN = 128
HEADS = 2
KV_HEADS = 1
LAYERS = 2
INTERMEDIATE = 256
VOCAB = 512
MAX_POS = 2048
INIT_STD = 0.02

# MiMo only: the target's attention and MLP output projections are multiplied by this, so the residual
# stream is dominated by the token embedding and the MTP head (which sees only the embedding) agrees with
# the target part of the time. Chosen on CPU (transformers fp32, greedy, 5 prompts x 256 tokens, K=3):
# 1.0 gives conditional per-position agreement .19/.55/.16, 0.5 about the same, 0.25 gives .68/.61/.71
# (2.4 tokens per step), 0.15 gives .87/.82/.90; the H200 run reports what vLLM actually accepted.
RESIDUAL_SCALE = 0.25
NUM_MTP_LAYERS = 1


# Weights of one MiMo MTP layer as the checkpoint names them (model.mtp_layers.<i>.<name>), with shape
# as a function of the config. From vLLM 0.24.0 models/mimo_mtp.py: MiMoMultiTokenPredictorLayer has
# token_layernorm, hidden_layernorm (RMSNorm(hidden)), input_proj (Linear(2*hidden, hidden, bias=False)),
# final_layernorm and an mtp_block = Qwen2DecoderLayer (models/qwen2.py: q/k/v with bias, o_proj and the
# gate/up/down MLP without, input/post-attention RMSNorms); MiMoMTP.map_model_name_to_mtp_param_name
# inserts "mtp_block." before every name but the four MTP-only ones, and load_weights stacks q/k/v into
# qkv_proj and gate/up into gate_up_proj.
def mtp_layer_weights(
    hidden: int, heads: int, kv_heads: int, intermediate: int
) -> dict[str, tuple[int, ...]]:
    head_dim = hidden // heads
    return {
        "token_layernorm.weight": (hidden,),
        "hidden_layernorm.weight": (hidden,),
        "input_proj.weight": (hidden, 2 * hidden),
        "final_layernorm.weight": (hidden,),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (heads * head_dim, hidden),
        "self_attn.q_proj.bias": (heads * head_dim,),
        "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        "self_attn.k_proj.bias": (kv_heads * head_dim,),
        "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        "self_attn.v_proj.bias": (kv_heads * head_dim,),
        "self_attn.o_proj.weight": (hidden, heads * head_dim),
        "mlp.gate_proj.weight": (intermediate, hidden),
        "mlp.up_proj.weight": (intermediate, hidden),
        "mlp.down_proj.weight": (hidden, intermediate),
    }


EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# --arch think: the walk. Each text is whole tokens of the trained vocabulary, none twice in the walk
# (a token has one successor in a next-token table), none a reasoning parser's markup ("<", ">").
# 17 thinking tokens leave room for a cap inside the thinking; the 6 answer tokens repeat.
THINK_START = "<think>"
THINK_END = "</think>"
THINKING = "The count of tokens is the total between every up and so on, there are no"
ANSWER = " that was it for me."
# The walk's logit over every other token: lm_head's entry times RMSNorm's sqrt(HIDDEN) (one-hot
# stream), 4 x 11.3 = 45, so even sampling at temperature 1 keeps to the walk (e^-45 for a stray).
WALK_LOGIT = 4.0

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Varied English (prose, dialogue, numbers, code-ish text, punctuation) so the learned merges look like
# a real tokenizer's: multi-byte words, digits and whitespace runs all get their own tokens.
CORPUS = """\
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of
foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light,
it was the season of Darkness, it was the spring of hope, it was the winter of despair.
Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse,
and nothing particular to interest me on shore, I thought I would sail about a little and see the
watery part of the world. It is a way I have of driving off the spleen and regulating the circulation.
In the beginning the Universe was created. This has made a lot of people very angry and been widely
regarded as a bad move. Far out in the uncharted backwaters of the unfashionable end of the western
spiral arm of the Galaxy lies a small unregarded yellow sun.
"Where are you going?" asked the girl. "To the market," said the old man, "to sell my apples and buy
bread." She laughed. "You have no apples left!" He looked down at his empty basket and sighed.
User: How many tokens per second does the server produce under load?
Assistant: It depends on the batch size, the model, and whether speculative decoding is enabled. With
three speculative tokens and high acceptance, each step can emit up to four tokens at once.
User: What is inter-token latency?
Assistant: Inter-token latency is the time between consecutive output tokens. If a chunk carries four
tokens, the gap between chunks is not the gap between tokens; divide by the token count.
The meeting is scheduled for 10:30 on Tuesday, March 14, 2023, in room 402. Please bring 3 copies of
the report, the Q1 budget ($12,500.00), and the 2022 figures: 1,024 units sold, 768 returned, 256 kept.
Temperatures ranged from -5 to 37 degrees; rainfall was 12.7 mm in January and 88.4 mm in July.
def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)

for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }
{"id": "req-1", "prompt": "Hello, world!", "max_tokens": 128, "stream": true}
SELECT name, count(*) FROM requests WHERE status = 'ok' GROUP BY name ORDER BY 2 DESC;
Once upon a time there was a lighthouse keeper who counted the ships that passed each night. Some
nights there were none; other nights there were so many that he lost count and started again. He kept
a ledger of every ship, every storm, and every star he could name, and when he grew old he gave the
ledger to the sea.
Rivers carve valleys, glaciers grind mountains, and wind sorts sand into dunes. Over millions of years
these slow forces shape the land as surely as any sudden quake or eruption.
The recipe calls for two cups of flour, one teaspoon of salt, three eggs, and a pinch of sugar. Mix
the dry ingredients first, then whisk in the eggs, and let the dough rest for thirty minutes.
Why do cats sleep so much? Nobody knows for certain, but they conserve energy for short bursts of
hunting. Dogs, on the other hand, sleep when they are bored, which is often.
Error: connection refused (errno 111). Retrying in 5 seconds... Retrying in 10 seconds... Giving up.
WARNING: the cache is almost full; 97% of blocks are in use. INFO: 12 requests running, 3 waiting.
A journey of a thousand miles begins with a single step. Knowledge speaks, but wisdom listens.
To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and
arrows of outrageous fortune, or to take arms against a sea of troubles, and by opposing end them.
"""


def _train_tokenizer() -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    return tok


def _config(arch: str, vocab_size: int, eos_id: int) -> PretrainedConfig:
    import torch
    from transformers import LlamaConfig, Qwen2Config

    if arch == "mimo":
        # model_type stays "qwen2" (transformers knows it; "mimo" would need trust_remote_code): vLLM
        # picks the model class from `architectures`, and its MTP override keys on that too.
        return Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=HIDDEN,
            intermediate_size=INTERMEDIATE,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            max_position_embeddings=MAX_POS,
            bos_token_id=eos_id,
            eos_token_id=eos_id,
            pad_token_id=eos_id,
            tie_word_embeddings=False,
            use_sliding_window=False,
            architectures=["MiMoForCausalLM"],
            num_nextn_predict_layers=NUM_MTP_LAYERS,
            dtype=torch.bfloat16,
        )
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HIDDEN // HEADS,
        max_position_embeddings=MAX_POS,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        tie_word_embeddings=False,
        dtype=torch.bfloat16,
    )


def _init_weights(model: PreTrainedModel, seed: int, draft_noise: float | None) -> None:
    """Seeded init in float32, so results don't depend on transformers' own (release-specific) init."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    noise_gen = torch.Generator().manual_seed(seed + 1_000_003)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                value = torch.ones(param.shape, dtype=torch.float32)
            else:
                value = torch.normal(0.0, INIT_STD, param.shape, generator=gen)
            if draft_noise:
                # Noise relative to each tensor's spread: a draft that agrees with the target often but
                # not always, which is what gives partial acceptance in speculative decoding.
                noise = torch.randn(param.shape, generator=noise_gen)
                value = value + noise * draft_noise * value.std(unbiased=False)
            param.copy_(value.to(param.dtype))


def _scale_residual_branches(model: PreTrainedModel, scale: float) -> None:
    """Scale what each layer adds to the residual stream: RESIDUAL_SCALE for the MiMo target, 0 for the
    thinking model, whose stream must be the current token's embedding alone."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
                param.mul_(scale)


def _walk(tokenizer: PreTrainedTokenizerFast) -> tuple[list[int], int]:
    """The thinking model's token walk (<think>, THINKING, </think>, ANSWER) and the index its last
    token leads back to: the answer's first, so the answer repeats."""
    head = [
        *tokenizer.convert_tokens_to_ids([THINK_START]),
        *tokenizer.encode(THINKING, add_special_tokens=False),
        *tokenizer.convert_tokens_to_ids([THINK_END]),
    ]
    walk = [*head, *tokenizer.encode(ANSWER, add_special_tokens=False)]
    if len(set(walk)) != len(walk) or tokenizer.eos_token_id in walk or len(walk) >= HIDDEN:
        raise ValueError(f"the walk must be distinct tokens, no EOS, fewer than {HIDDEN}: {walk}")
    return walk, len(head)


def _set_walk(model: PreTrainedModel, walk: list[int], loop: int) -> None:
    """Make greedy decoding follow `walk` from any token off it, then walk[loop:] over and over.

    With the layers' output projections zero (_scale_residual_branches(model, 0)), the last hidden
    state is the current token's embedding, so the logits are lm_head(norm(embedding)): a table. Every
    token off the walk embeds as one-hot dimension 0, the walk's i-th token as dimension i+1; lm_head
    row `next` has WALK_LOGIT in the dimension of the token `next` follows. The layers' other weights
    stay random: vLLM runs full attention and MLP per step, as for the random Llama.
    """
    import torch

    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        embed.zero_()
        embed[:, 0] = 1.0
        for dim, token in enumerate(walk, start=1):
            embed[token, 0] = 0.0
            embed[token, dim] = 1.0
        head = model.get_output_embeddings().weight
        head.zero_()
        for dim, successor in enumerate([*walk, walk[loop]]):
            head[successor, dim] = WALK_LOGIT


def _check_walk(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, walk: list[int], loop: int
) -> None:
    """Refuse to write a thinking model that strays: after a chat prompt, each step's argmax is the
    walk's next token, the last leading back to walk[loop] (in bf16, as vLLM will run it)."""
    import torch

    chat = [{"role": "user", "content": "Hello?"}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    expected = [*walk, walk[loop]]
    with torch.no_grad():
        logits = model(torch.tensor([[*prompt, *walk]])).logits[0, len(prompt) - 1 :]
    got = logits.argmax(-1).tolist()
    if got != expected:
        raise ValueError(f"the thinking model strays from its walk: {got} != {expected}")


def _mtp_tensors(model: PreTrainedModel) -> dict[str, Tensor]:
    """The embedding-path MTP head (module docstring): identity on the next token's embedding."""
    import torch

    cfg = model.config
    shapes = mtp_layer_weights(HIDDEN, HEADS, KV_HEADS, INTERMEDIATE)
    tensors = {}
    for i in range(NUM_MTP_LAYERS):
        for name, shape in shapes.items():
            if name.endswith("norm.weight"):
                value = torch.ones(shape)
            elif name == "input_proj.weight":
                # cat([previous_hidden, token_embedding]) @ W.T: keep the embedding half only.
                value = torch.cat([torch.zeros(HIDDEN, HIDDEN), torch.eye(HIDDEN)], dim=1)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                value = torch.zeros(shape)  # the block adds nothing: its output is its input
            else:
                # Unused by the output (o_proj and down_proj are zero) but real, so vLLM loads and runs
                # a full decoder layer per draft step, as with a trained head.
                gen = torch.Generator().manual_seed(7919 * (i + 1) + len(name))
                value = torch.normal(0.0, INIT_STD, shape, generator=gen)
            tensors[f"model.mtp_layers.{i}.{name}"] = value.to(torch.bfloat16).contiguous()
    assert cfg.num_nextn_predict_layers == NUM_MTP_LAYERS
    return tensors


def _add_mtp_layers(out_dir: Path, model: PreTrainedModel) -> None:
    from safetensors.torch import load_file, save_file

    path = out_dir / "model.safetensors"
    tensors = load_file(str(path))
    tensors.update(_mtp_tensors(model))
    save_file(dict(sorted(tensors.items())), str(path), metadata={"format": "pt"})


def build(out_dir: Path, seed: int = 0, draft_noise: float | None = None, arch: str = "llama") -> Path:
    """Write config, safetensors weights, tokenizer and chat template into out_dir."""
    import torch
    from tokenizers import AddedToken
    from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2ForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    raw_tok = _train_tokenizer()
    if arch == "think":  # ids VOCAB and VOCAB + 1, after the trained ones: the other models' files stay
        raw_tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw_tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=None,
        model_max_length=MAX_POS,
        chat_template=CHAT_TEMPLATE,
    )
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    config = _config(arch, len(tokenizer), eos_id)
    model = (Qwen2ForCausalLM if arch == "mimo" else LlamaForCausalLM)(config).to(torch.bfloat16)
    _init_weights(model, seed, draft_noise)
    if arch == "mimo":
        _scale_residual_branches(model, RESIDUAL_SCALE)
    elif arch == "think":
        _scale_residual_branches(model, 0.0)
        walk, loop = _walk(tokenizer)
        _set_walk(model, walk, loop)
        _check_walk(model, tokenizer, walk, loop)
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if arch == "mimo":
        _add_mtp_layers(out_dir, model)
        # save_pretrained writes the class it saved (Qwen2ForCausalLM); vLLM must see MiMo.
        config_path = out_dir / "config.json"
        saved = json.loads(config_path.read_text())
        saved["architectures"] = ["MiMoForCausalLM"]
        saved["num_nextn_predict_layers"] = NUM_MTP_LAYERS
        config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft-noise", type=float, default=None)
    parser.add_argument("--arch", choices=["llama", "mimo", "think"], default="llama")
    args = parser.parse_args(argv)
    out = build(args.out_dir, seed=args.seed, draft_noise=args.draft_noise, arch=args.arch)
    print(
        json.dumps(
            {"out_dir": str(out), "seed": args.seed, "draft_noise": args.draft_noise, "arch": args.arch}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
