"""meta.json as types: what was run, against what, written by `RunFolder` (workflows/run_folder.py) as
these structs and read back as them (store/folder.RunFiles.meta), decoded and checked once.

One schema for every command that writes a run folder (`run`, `compare`, sweep trials, `smoke`, bisect
trials): the run's context at the top, then each variant's entry (`MetaVariant`). The JSON a struct
encodes to is the file key for key: keys a run always writes are fields with a default (a folder from
before the key reads with it empty), keys written only when they apply are `UNSET` until set and left
out of the file while unset, so a key's absence keeps its meaning (a `speculative_config` absent is
"unknown", null is "speculation off"). A key this itlaudit does not know is ignored on reading, as
every reader before the types did. `format` and `records_format` are not fields: the writer stamps
them (store/rundir.write_meta) and the reader checks them.

The nested records written as they are built elsewhere stay TypedDicts (the host, each server's
environment record, the workload): their keys are the file's too. What is free-form by nature (a
stored fingerprint the ledger checks field by field, /metrics counters, a model's config.json, the
speculative config as given, telemetry records) is `Mapping[str, object]`: a reader narrows each
value with isinstance before using it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NotRequired, TypedDict

import msgspec
from msgspec import UNSET, UnsetType

from itlaudit.errors import RecordsError
from itlaudit.model.jsonvalue import JSONObject, JSONScalar
from itlaudit.model.vocabulary import QualityGate

# A free-form block (see the module's docstring): read with isinstance, never trusted as a shape.
Block = Mapping[str, object]


class GpuInfo(TypedDict):
    """One local GPU as nvidia-smi names it: an element of the environment record's `gpus` list."""

    name: str
    compute_capability: str
    driver: NotRequired[str]  # not in folders written before it was recorded


class HostEnvironment(TypedDict):
    """meta.json's and the smoke report's `environment`/`host` block (its JSON form, unchanged)."""

    itlaudit_version: str
    cpu_architecture: str
    platform: str
    python: str
    gpus: list[GpuInfo] | None


class EnvironmentRecord(TypedDict):
    """One server's record (meta.json's variant `environment`, smoke's servers)."""

    url: str
    server_version: NotRequired[str | None]  # absent in folders from before SGLang's builds
    simulated: NotRequired[bool]
    vllm_version: str | None
    vllm_commit: str | None
    system_fingerprint: str | list[str] | None
    launched: bool
    launch_kind: str | None
    non_default_args: Mapping[str, object] | None  # vLLM's own account, free-form
    env: dict[str, str] | None


class WorkloadMeta(TypedDict, total=False):
    """meta.json's "workload" block (model/run_context.workload_meta writes every key; a folder may
    have none: read with .get)."""

    endpoint: str
    model: str
    dataset: str
    input_len: int | str | None
    num_prompts: int
    max_concurrency: int
    request_rate: float | None
    burstiness: float
    duration_s: float | None
    duration_grace_s: float | None
    num_warmups: int
    max_tokens: int | str | None
    ignore_eos: bool
    temperature: float | None


class Roofline(msgspec.Struct, kw_only=True):
    """The bandwidth floor's inputs as the run was given them (analysis.roofline reads them)."""

    model_config: Block | None = None  # the config.json the run named, read
    mem_bandwidth_gbps: float | None = None
    bytes_per_token: float | None = None


class MetaVariant(msgspec.Struct, kw_only=True):
    """One variant's entry, in the order a pass writes it: where it was sent, what identified the
    server, what the capture and the window's hooks said, and the server's environment record."""

    url: str | None = None
    headers: list[str] = msgspec.field(default_factory=list)  # names only, never their values
    fingerprint: Block | UnsetType = UNSET  # the ledger's (store/ledger checks it field by field)
    reset_prefix_cache: Block | UnsetType = UNSET
    workload: WorkloadMeta | UnsetType = UNSET  # what was sent, where it differs from the run's
    # what the capture says of itself (capture/described.CaptureDescription)
    cluster: str | UnsetType = UNSET
    workers: list[Block] | UnsetType = UNSET
    lost_workers: list[Block] | UnsetType = UNSET
    warmup_workers: list[Block] | UnsetType = UNSET
    warmup_lost_workers: list[Block] | UnsetType = UNSET
    reply_lengths: str | UnsetType = UNSET
    random_chat: Block | UnsetType = UNSET
    # the window's hooks: compare's /metrics counters, the telemetry's files (telemetry/window.py)
    before: Block | UnsetType = UNSET
    server_metrics: Block | UnsetType = UNSET
    gpu_telemetry: Block | UnsetType = UNSET
    profile: Block | UnsetType = UNSET
    notes: list[str] | UnsetType = UNSET
    after: Block | UnsetType = UNSET
    load_format: str | UnsetType = UNSET  # "dummy": gibberish by construction
    server_error: str | UnsetType = UNSET
    model_config: Block | UnsetType = UNSET  # a launched server's config.json (the floor's input)
    speculative_config: Block | UnsetType | None = UNSET  # null: speculation off; unset: unknown
    environment: EnvironmentRecord | UnsetType = UNSET

    def update(self, fields: Mapping[str, object]) -> None:
        """Add what a capture or a window hook reports (its keys are this entry's fields), checked
        as a reader would check them. A key that is no field is a bug, refused here rather than lost
        from the file."""
        unknown = set(fields) - set(self.__struct_fields__)
        if unknown:
            raise TypeError(f"not meta.json variant keys: {', '.join(sorted(unknown))}")
        merged = msgspec.convert({**msgspec.to_builtins(self), **fields}, MetaVariant)
        for name in fields:
            setattr(self, name, getattr(merged, name))

    @property
    def workers_count(self) -> int:
        """How many capture processes measured the variant (0: not recorded)."""
        return len(self.workers) if isinstance(self.workers, list) else 0

    @property
    def server(self) -> EnvironmentRecord | None:
        """The server's environment record; None where the pass did not get that far."""
        return None if isinstance(self.environment, UnsetType) else self.environment

    @property
    def version(self) -> str | None:
        """The server's version string as its environment record holds it (vLLM's, SGLang's, the
        simulator's), or None."""
        server = self.server
        return (server.get("server_version") or server.get("vllm_version")) if server else None


class Meta(msgspec.Struct, kw_only=True):
    """meta.json: the run's context, then `variants` in the order they ran; a command's own context
    (a sweep trial's `sweep`, a bisect trial's `bisect`, an --append round's), and how an unfinished
    run ended (`interrupted`, `failed`) and what finishing cost (`finish_s`) when they apply."""

    itlaudit_version: str | None = None
    scenario: str | None = None
    scenario_path: str | None = None
    endpoint: str | None = None
    quality_gate: QualityGate | None = None  # None: a folder from before the gate (judged relatively)
    goodput: dict[str, float] = msgspec.field(default_factory=dict)
    metric_percentiles: list[float] | None = None  # None: the defaults (model/block)
    percentile_metrics: list[str] | None = None
    tokenizer: str | None = None
    roofline: Roofline = msgspec.field(default_factory=Roofline)
    workload: WorkloadMeta | None = None
    started_at_unix: float | None = None
    environment: HostEnvironment | None = None
    command_line: str | None = None
    label: str | None = None
    metadata: dict[str, JSONScalar] = msgspec.field(default_factory=dict)
    backend: str | None = None
    appended_at_unix: float | UnsetType = UNSET
    append_tag: str | UnsetType = UNSET
    sweep: Block | UnsetType = UNSET
    bisect: Block | UnsetType = UNSET
    variants: dict[str, MetaVariant] = msgspec.field(default_factory=dict)
    interrupted: Block | UnsetType = UNSET
    failed: Block | UnsetType = UNSET
    finish_s: dict[str, float] | UnsetType = UNSET

    @classmethod
    def from_json(cls, data: object, path: Path) -> Meta:
        """meta.json's content as read from `path` (its formats already checked); one that is not run
        metadata is one RecordsError line naming the file."""
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise RecordsError(
                f"{path}: not run metadata this itlaudit reads ({exc}); repair or remove it"
            ) from None

    def to_json(self) -> JSONObject:
        """meta.json's content (without `format` and `records_format`, which the writer stamps)."""
        data: JSONObject = msgspec.to_builtins(self)
        return data

    def variant(self, name: str) -> MetaVariant:
        """The variant's entry; one a run did not write reads empty."""
        return self.variants.get(name) or MetaVariant()

    @property
    def gpus(self) -> list[GpuInfo]:
        """The host's GPUs as nvidia-smi named them (none: a CPU host, or not recorded)."""
        return (self.environment["gpus"] if self.environment else None) or []

    @property
    def ended_early(self) -> bool:
        """The run was interrupted or failed: its folder holds what finished, not a whole run."""
        return bool(self.interrupted) or bool(self.failed)


# meta.json's keys whichever command wrote the folder: the fields every writer sets (a command's own
# context, how a run ended and `finish_s` come on top, when they apply).
META_KEYS = tuple(f.encode_name for f in msgspec.structs.fields(Meta) if f.default is not UNSET)
