"""Build a tiny random-weight Llama (plus tokenizer) that a real vLLM CPU server can load.

No model can be downloaded on a testbed, yet the auditor needs a real engine to produce real wire
traffic, so the model is synthesised locally. It is deliberately useless as a language model: only its
shape matters (small enough to decode in milliseconds on two cores, large enough that vLLM's CPU
attention kernel accepts it: head_dim 64, since 16 is rejected).

This module imports torch/transformers/tokenizers, which live only in the testbed venv; it is run as a
script by that venv's python (``python -P itlaudit/tinymodel.py OUT_DIR``, where -P keeps itlaudit/
off sys.path so its subpackages cannot shadow stdlib modules; or ``python -m itlaudit.tinymodel``) and
must never be imported by the rest of itlaudit. It is self-contained for the same reason: run by file
path, it cannot import its own package.

Output is byte-deterministic for a given (seed, draft_noise): weights come from an explicit
``torch.Generator`` rather than transformers' init code (which changes between releases), and the BPE
tokenizer is trained on the fixed corpus below.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HIDDEN = 128
HEADS = 2
KV_HEADS = 1
LAYERS = 2
INTERMEDIATE = 256
VOCAB = 512
MAX_POS = 2048
INIT_STD = 0.02

EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

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


def _train_tokenizer() -> object:
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


def _config(vocab_size: int, eos_id: int) -> object:
    import torch
    from transformers import LlamaConfig

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


def _init_weights(model: object, seed: int, draft_noise: float | None) -> None:
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


def build(out_dir: Path, seed: int = 0, draft_noise: float | None = None) -> Path:
    """Write config, safetensors weights, tokenizer and chat template into out_dir."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    raw_tok = _train_tokenizer()
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
    config = _config(len(tokenizer), eos_id)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    _init_weights(model, seed, draft_noise)
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft-noise", type=float, default=None)
    args = parser.parse_args(argv)
    out = build(args.out_dir, seed=args.seed, draft_noise=args.draft_noise)
    print(json.dumps({"out_dir": str(out), "seed": args.seed, "draft_noise": args.draft_noise}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
