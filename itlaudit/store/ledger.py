"""Experiment ledger: every run fingerprinted, so the same experiment is not run twice by accident.

Seed 003 kept its experiment matrix (variant → result → output hash → conclusion) and a "do not
repeat" list by hand, because reruns of already-settled variants cost hours and proved nothing. Here
each variant of a run gets a fingerprint of what decides its outcome — the server (its URL, or for a
launched server the GPU it ran on), its build (vLLM version, system_fingerprint, interpreter/image/
command), its arguments, the environment it ran with, and the workload. A run whose fingerprint is
already in the ledger is named as a repeat, with the `itlaudit diff` that compares the two: repeating
a benchmark is how a user sees its noise, so a repeat is refused only on request (`--no-repeat`).
The ledger is append-only JSONL: run lines and conclusion lines (the latest wins). Credentials in the
environment or arguments are masked before anything is fingerprinted or written (redact.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import NotRequired, TypedDict, cast

import msgspec

from itlaudit.analysis.derive import summarize_run
from itlaudit.analysis.quality import text_quality
from itlaudit.analysis.summary import RunSummary, VariantSummary
from itlaudit.errors import DuplicateRunError, ItlauditError, RecordsError
from itlaudit.model.formats import check_format, stamped
from itlaudit.model.jsonvalue import JSONMapping, JSONObject
from itlaudit.model.meta import GpuInfo, Meta, MetaVariant
from itlaudit.model.records import RequestRecord
from itlaudit.model.redact import redact_args, redact_env, redact_json
from itlaudit.model.run_context import SIMULATOR, server_build
from itlaudit.model.scenario import Scenario, load_scenario
from itlaudit.model.schedule import DURATION_GRACE_S, Arrivals
from itlaudit.store.folder import RunFiles
from itlaudit.store.jsonl import RecordWriter, iter_jsonl, load_records
from itlaudit.store.rundir import META_FILE, REQUESTS_FILE

DEFAULT_LEDGER = Path("reports") / "ledger.jsonl"
KIND_RUN = "run"
KIND_CONCLUSION = "conclusion"
DIGEST_CHARS = 16

# Environment variables that change what a vLLM server computes or how it schedules: the seeds'
# variants were switched by exactly these (VLLM_BATCH_INVARIANT, VLLM_ENABLE_V1_MULTIPROCESSING,
# VLLM_USE_DEEP_GEMM, a patched tree on PYTHONPATH). A launched server inherits them from us.
_ENV_RE = re.compile(r"^(VLLM_|CUDA_|TORCH_|NCCL_|OMP_|SGLANG_|PYTHONPATH$|LD_LIBRARY_PATH$|HF_)")
# vLLM's system_fingerprint is `vllm-<version>-<hash8>`; the simulator's `itlaudit-sim-<version>-<hash8>`.
_FINGERPRINT_VERSION_RE = re.compile(rf"^(vllm|{SIMULATOR})-(.+)-[0-9a-f]{{8}}$")


class FingerprintBuild(TypedDict):
    """A fingerprint's build: what the server said it is, and where it ran. The launch keys are there
    only for a launched server, so a connected server's digest is the one it always had."""

    version: str | None
    system_fingerprint: str | None
    url: str | None
    gpus: list[str] | None
    kind: NotRequired[str]
    python: NotRequired[str | None]
    image: NotRequired[str | None]
    command: NotRequired[list[str]]


@dataclass(frozen=True)
class Fingerprint:
    """What decides a variant's outcome; two runs with equal digests repeat one experiment."""

    variant: str
    build: FingerprintBuild
    server_args: list[str]
    env: dict[str, str]
    workload: JSONObject

    @property
    def digest(self) -> str:
        # The variant's name is a label, not part of the experiment: renaming K3 to MTP repeats it.
        parts = {
            "build": self.build,
            "server_args": self.server_args,
            "env": self.env,
            "workload": self.workload,
        }
        canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_CHARS]

    def to_json(self) -> JSONObject:
        return {**asdict(self), "digest": self.digest}


def version_from_system_fingerprint(system_fingerprint: str | None) -> str | None:
    """The /version a server would have answered, from its system_fingerprint (the version survives in
    records): vLLM's `0.32.0`, or the simulator's `itlaudit-sim 0.1.0`, never mistaken for vLLM."""
    match = _FINGERPRINT_VERSION_RE.match(system_fingerprint or "")
    if match is None:
        return None
    return f"{SIMULATOR} {match.group(2)}" if match.group(1) == SIMULATOR else match.group(2)


def relevant_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if _ENV_RE.match(k)}


def gpu_identity(gpus: Sequence[GpuInfo] | None) -> list[str] | None:
    """Name and compute capability of each GPU (environment.gpus()); the driver is left out, as an
    upgrade of it alone does not make another experiment. None when nvidia-smi could not tell."""
    if not gpus:
        return None
    return [f"{gpu.get('name')} (sm {gpu.get('compute_capability')})" for gpu in gpus]


def variant_fingerprint(
    scenario: Scenario,
    variant: str,
    server: Mapping[str, object],
    environ: Mapping[str, str] | None = None,
    *,
    url: str | None = None,
    gpus: Sequence[GpuInfo] | None = None,
) -> Fingerprint:
    """The fingerprint of one variant. `server` is what the running server says about itself
    (`{"version", "system_fingerprint"}`, e.g. from capture.server_info.server_identity, or recovered
    from a run's records; None where it could not tell); `environ` is this process's environment,
    which a launched server inherits (ignored for a server we only connect to). A server we connect
    to is told apart by `url`: the same nightly on two machines is two experiments even when neither
    answers /version. A launched server's URL is a fresh port each time, so it is told apart by the
    `gpus` of this host (environment.gpus()) instead."""
    chosen = next((v for v in scenario.variants if v.name == variant), None)
    if chosen is None:
        names = ", ".join(v.name for v in scenario.variants)
        raise ItlauditError(f"variant {variant!r} is not in scenario {scenario.name!r} ({names})")
    workload = scenario.workload
    system_fingerprint = _text(server.get("system_fingerprint"))
    launch = chosen.launch
    build: FingerprintBuild = {
        "version": _text(server.get("version")) or version_from_system_fingerprint(system_fingerprint),
        "system_fingerprint": system_fingerprint,
        "url": None if launch is not None else url,
        "gpus": gpu_identity(gpus) if launch is not None else None,
    }
    env: dict[str, str] = {}
    args: list[str] = []
    if launch is not None:
        build["kind"] = launch.kind
        build["python"] = launch.python
        build["image"] = launch.image
        build["command"] = redact_args(launch.command)
        args = ["--model", str(launch.model), "--served-model-name", str(launch.served_model_name)]
        args = redact_args([*args, *launch.server_args])
        env = redact_env({**relevant_env(environ or {}), **launch.env})
    prompts = json.dumps(workload.prompts, ensure_ascii=False).encode()
    workload_print: JSONObject = {
        "endpoint": scenario.endpoint,
        "model": scenario.model,
        "prompts_sha256": hashlib.sha256(prompts).hexdigest(),
        "num_requests": workload.num_requests,
        "concurrency": workload.concurrency,
        "params": asdict(workload.params),
        "extra_body": workload.extra_body,
    }
    # Only where set, so a closed-loop prompt-list run keeps the fingerprint it always had.
    if workload.arrivals != Arrivals():
        arrivals = asdict(workload.arrivals)
        if arrivals["duration_grace_s"] == DURATION_GRACE_S:  # the default: as before the key existed
            del arrivals["duration_grace_s"]
        workload_print["arrivals"] = arrivals
    if workload.dataset is not None:
        # Each entry's fields as they are (asdict's deep copy of every prompt's ids took 24 s for 200K
        # random prompts); the JSON, and so the fingerprint, is the same.
        shallow = [{f.name: getattr(e, f.name) for f in fields(e)} for e in workload.dataset.entries]
        entries = json.dumps(shallow, ensure_ascii=False).encode()
        workload_print["dataset_sha256"] = hashlib.sha256(entries).hexdigest()
    return Fingerprint(
        variant=variant,
        build=build,
        server_args=args,
        env=dict(sorted(env.items())),
        workload=workload_print,
    )


def load_ledger(path: Path) -> list[JSONObject]:
    """Every ledger line in order; a ledger that does not exist yet is empty. A line in a format this
    itlaudit does not read (model/formats.py) is refused in one line naming it."""
    if not path.exists():
        return []
    try:
        lines = list(iter_jsonl(path))
    except RecordsError as exc:
        raise RecordsError(f"ledger {exc}") from None
    for number, line in enumerate(lines, 1):
        check_format(f"ledger {path}:{number}", line)
    return lines


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _table(line: JSONMapping, key: str) -> JSONMapping:
    """A ledger line's table (a run's `result`, its fingerprint's parts, their `build`); {} where a
    line lacks it."""
    found = line.get(key)
    return found if isinstance(found, Mapping) else {}


# A ledger line is JSON as read back (load_ledger): a run or a conclusion, of any itlaudit since the
# first ledger, so each value is narrowed where it is read.
def _runs(lines: Sequence[JSONMapping]) -> list[JSONMapping]:
    return [line for line in lines if line.get("kind") == KIND_RUN]


def find_run(fingerprint: Fingerprint | str, lines: Sequence[JSONMapping]) -> JSONMapping | None:
    """The earliest ledger run with this fingerprint, if any."""
    digest = fingerprint if isinstance(fingerprint, str) else fingerprint.digest
    return next((line for line in _runs(lines) if line.get("fingerprint") == digest), None)


def check_new_run(
    fingerprint: Fingerprint | str, ledger_path: Path, *, no_repeat: bool = False
) -> JSONMapping | None:
    """Call before a run: the earlier ledger run of this fingerprint (a repeat), or None. With
    `no_repeat` a repeat raises DuplicateRunError naming the earlier run instead."""
    earlier = find_run(fingerprint, load_ledger(ledger_path))
    if earlier is None or not no_repeat:
        return earlier
    digest = fingerprint if isinstance(fingerprint, str) else fingerprint.digest
    raise DuplicateRunError(
        f"fingerprint {digest} (same server, build, server args, environment and workload) was already "
        f"run as variant {earlier.get('variant')!r} of run {earlier.get('run_id')!r} "
        f"({earlier.get('run_dir')}), result: {format_result(_table(earlier, 'result'))}; "
        "drop --no-repeat to repeat it on purpose"
    )


def repeat_warning(earlier: JSONMapping, variant: str, run_dir: Path) -> str:
    """The one line `run` prints for a repeat: which earlier run, and the command that compares them."""
    return (
        f"{variant}: same experiment as run {earlier.get('run_id')!r} "
        f"(variant {earlier.get('variant')!r}): `itlaudit diff {earlier.get('run_dir')} {run_dir}`"
    )


def outputs_sha256(records: Sequence[RequestRecord]) -> str:
    """One hash over every output in request order: equal hashes mean the variant wrote the same text."""
    ordered = sorted(records, key=lambda r: r.request_id)
    joined = "\n".join(text_quality(r.output).text_sha256 for r in ordered)
    return hashlib.sha256(joined.encode()).hexdigest()


def variant_result(block: VariantSummary | None, records: Sequence[RequestRecord]) -> JSONObject:
    """The matrix's result cell: what a reader needs to recall the outcome (seed 003's columns).
    `block` is None for a variant that recorded no request."""
    qualities = [text_quality(r.output) for r in records]
    return {
        "requests": None if block is None else block.requests,
        "errors": None if block is None else block.errors,
        "completion_tokens_p50": None if block is None else block.completion_tokens.get("p50"),
        "itl_ms_p50": None if block is None else block.itl_ms.get("p50"),
        "max_digit_ratio": max((q.digit_ratio for q in qualities), default=None),
        "weird_runs": sum(q.weird_runs for q in qualities),
        "findings": {} if block is None else dict(block.findings),
        "outputs_sha256": outputs_sha256(records),
    }


def run_line(
    run_id: str,
    run_dir: Path,
    fingerprint: Fingerprint,
    result: JSONObject,
    repeat_of: str | None = None,
) -> JSONObject:
    return stamped(
        {
            "kind": KIND_RUN,
            "run_id": run_id,
            "run_dir": str(run_dir),
            "variant": fingerprint.variant,
            "fingerprint": fingerprint.digest,
            "fingerprint_parts": fingerprint.to_json(),
            "result": dict(result),
            "repeat_of": repeat_of,
            "recorded_at_unix": time.time(),
        }
    )


def conclusion_line(run_id: str, variant: str, text: str) -> JSONObject:
    return stamped(
        {
            "kind": KIND_CONCLUSION,
            "run_id": run_id,
            "variant": variant,
            "text": text,
            "recorded_at_unix": time.time(),
        }
    )


def append(ledger_path: Path, lines: Sequence[JSONMapping]) -> None:
    with RecordWriter(ledger_path) as writer:
        for line in lines:
            writer.write(redact_json(dict(line)))


def format_result(result: JSONMapping) -> str:
    def num(key: str, fmt: str) -> str:
        value = result.get(key)
        return "?" if value is None else format(value, fmt)

    found = ", ".join(f"{c}×{n}" for c, n in _table(result, "findings").items()) or "no findings"
    return (
        f"{result.get('requests')} req, tokens p50 {num('completion_tokens_p50', 'g')}, "
        f"ITL p50 {num('itl_ms_p50', '.2f')} ms, digit_ratio max {num('max_digit_ratio', '.4f')}, {found}"
    )


def matrix(lines: Sequence[JSONMapping]) -> list[dict[str, str]]:
    """Seed 003's experiment matrix, one row per recorded variant run, latest conclusion attached."""
    conclusions = {
        (line.get("run_id"), line.get("variant")): str(line.get("text"))
        for line in lines
        if line.get("kind") == KIND_CONCLUSION
    }
    rows = []
    for line in _runs(lines):
        build = _table(_table(line, "fingerprint_parts"), "build")
        result = _table(line, "result")
        rows.append(
            {
                "run": str(line.get("run_id")),
                "variant": str(line.get("variant")),
                "build": _build_text(build),
                "result": format_result(result) + _repeat_note(line),
                "hash": str(result.get("outputs_sha256", ""))[:DIGEST_CHARS],
                "fingerprint": str(line.get("fingerprint")),
                "conclusion": conclusions.get((line.get("run_id"), line.get("variant")), ""),
            }
        )
    return rows


def _build_text(build: JSONMapping) -> str:
    """The build as the matrix names it, its system_fingerprint beside it when the server sent one
    (never "(None)")."""
    named = server_build(_text(build.get("version")))
    fingerprint = build.get("system_fingerprint")
    return f"{named} ({fingerprint})" if fingerprint else named


def _repeat_note(line: JSONMapping) -> str:
    if line.get("repeat_of"):
        return f" (repeat of {line['repeat_of']})"
    return " (forced)" if line.get("forced") else ""  # ledgers written before repeats were allowed


def _read_meta(run_dir: Path) -> Meta:
    path = run_dir / META_FILE
    try:
        return RunFiles(run_dir).meta_file
    except FileNotFoundError:
        raise RecordsError(f"{path}: no such file; point at a run folder written by `itlaudit run`") from None
    except (OSError, ValueError) as exc:
        raise RecordsError(f"{path}: cannot read run metadata ({exc})") from None


def _server_from_records(records: Sequence[RequestRecord], meta_variant: MetaVariant) -> JSONObject:
    fingerprints = Counter(r.system_fingerprint for r in records if r.system_fingerprint)
    system_fingerprint = fingerprints.most_common(1)[0][0] if fingerprints else None
    return {"version": meta_variant.version, "system_fingerprint": system_fingerprint}


def _stored_fingerprint(path: Path, stored: Mapping[str, object]) -> Fingerprint:
    """The fingerprint `run` stored in meta.json, checked field by field; its build and workload are
    kept exactly as stored (a key this itlaudit does not know still counts in the digest)."""
    try:
        build = stored["build"]
        msgspec.convert(build, FingerprintBuild)
        workload = stored["workload"]
        if not isinstance(workload, dict):
            raise msgspec.ValidationError("`workload` is not an object")
        return Fingerprint(
            variant=msgspec.convert(stored["variant"], str),
            build=cast(FingerprintBuild, build),
            server_args=msgspec.convert(stored["server_args"], list[str]),
            env=msgspec.convert(stored["env"], dict[str, str]),
            workload=workload,
        )
    except (KeyError, msgspec.ValidationError) as exc:
        raise RecordsError(
            f"{path}: a stored fingerprint is damaged ({exc}); rerun `itlaudit run` for this folder"
        ) from None


def run_fingerprints(
    run_dir: Path, records: Sequence[RequestRecord], environ: Mapping[str, str]
) -> dict[str, Fingerprint]:
    """Each variant's fingerprint for a finished run folder: the one `run` stored in meta.json when it
    did, else rebuilt from the scenario file and the records (the environment is then today's)."""
    path = run_dir / META_FILE
    meta = _read_meta(run_dir)
    out: dict[str, Fingerprint] = {}
    scenario = None
    for name, info in meta.variants.items():
        if info.fingerprint:
            out[name] = _stored_fingerprint(path, info.fingerprint)
            continue
        if scenario is None:
            scenario_path = meta.scenario_path
            if not scenario_path:
                raise RecordsError(f"{path}: no scenario_path, so the run cannot be fingerprinted")
            # read for its workload: the servers ran already, whoever started them (a bisect or
            # track nightly trial's provider, whose launch tables name no kind)
            scenario = load_scenario(Path(scenario_path), provided=True)
        mine = [r for r in records if r.variant == name]
        server = _server_from_records(mine, info)
        out[name] = variant_fingerprint(scenario, name, server, environ, url=info.url, gpus=meta.gpus)
    return out


def record_run(
    run_dir: Path,
    ledger_path: Path,
    *,
    no_repeat: bool = False,
    environ: Mapping[str, str] | None = None,
    summary: RunSummary | None = None,
    records: Sequence[RequestRecord] | None = None,
) -> list[JSONObject]:
    """Add a finished run's variants to the ledger, each repeat marked with the run it repeats; with
    `no_repeat` a repeat is refused and nothing is written. `summary` and `records` are the run's, as
    its one derivation gave them; without them (`itlaudit ledger add` of a past folder) requests.jsonl
    is read and derived here."""
    if records is None:
        records = load_records(run_dir / REQUESTS_FILE)
    fingerprints = run_fingerprints(run_dir, records, environ or {})
    earlier = {
        name: check_new_run(fingerprint, ledger_path, no_repeat=no_repeat)
        for name, fingerprint in fingerprints.items()
    }
    if summary is None:
        summary = summarize_run(records, list(fingerprints))
    lines = [
        run_line(
            run_dir.name,
            run_dir,
            fingerprint,
            variant_result(summary.variants.get(name), [r for r in records if r.variant == name]),
            _text((earlier[name] or {}).get("run_id")),
        )
        for name, fingerprint in fingerprints.items()
    ]
    append(ledger_path, lines)
    return lines
