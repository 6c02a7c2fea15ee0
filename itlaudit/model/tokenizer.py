"""A model's tokenizer.json, read from disk, for a stream that counts its tokens nowhere (--tokenizer).

itlaudit counts tokens from the server's usage.completion_tokens, or the token ids it returns; a server
that sends neither per chunk (an OpenAI-compatible server without continuous usage, a proxy that strips
it) leaves only the chunks to count, which under speculative decoding is the inflated figure itlaudit
exists to correct. vllm bench serve's `--tokenizer` re-counts such output with a local tokenizer; this
does the same, per chunk: the streamed text is tokenized once, and each chunk is credited the tokens that
end inside it (analysis.metrics.tokens_at_chunk_ends).

Only a local file is read: a folder holding tokenizer.json (a Hugging Face model folder) or the file
itself. Nothing is downloaded; `tokenizers` (the `tokenizer` extra) is imported only when a run needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from itlaudit.errors import ScenarioError

TOKENIZER_FILE = "tokenizer.json"
_INSTALL = "pip install 'itlaudit[tokenizer]'"


def tokenizer_file(path: Path) -> Path:
    """The tokenizer.json that `path` names (the file, or a model folder holding it); one ScenarioError
    line where there is none."""
    found = path / TOKENIZER_FILE if path.is_dir() else path
    if not found.is_file():
        raise ScenarioError(
            f"tokenizer {path}: no {TOKENIZER_FILE} there; give a local model folder holding one "
            "(itlaudit downloads nothing), or leave --tokenizer out to count the server's usage"
        )
    return found


class LocalTokenizer:
    """One tokenizer.json, loaded once: each text's token end offsets, in characters."""

    def __init__(self, path: Path) -> None:
        found = tokenizer_file(path)
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ScenarioError(
                f"--tokenizer needs the tokenizers package, which is not installed: {_INSTALL}"
            ) from None
        try:
            self._tokenizer: Any = Tokenizer.from_file(str(found))
        except Exception as exc:  # the Rust reader's errors carry no type of their own
            raise ScenarioError(f"tokenizer {found}: not a tokenizer.json it can read ({exc})") from None
        self.path = found

    def token_ends(self, text: str) -> Sequence[int]:
        """Where each token of `text` ends: the model's own encoding, without the special tokens a
        prompt would get (a reply carries none)."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return [end for _, end in encoding.offsets]
