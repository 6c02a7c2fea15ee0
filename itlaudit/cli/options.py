"""What several commands take the same way, declared once (one flag, one help text, one check), and
the help style every command prints with.

Option groups are plain functions whose parameters are typer options and whose result is what the
command needs (`capture_options` → CaptureOptions, `workload_flags` → ScenarioFlags);
`with_options` adds a group's parameters to a command and hands it the result.

Capture options are built here alone (`build_capture`): every command that streams (run, compare,
sweep, selfcheck, smoke, bisect) gets its CaptureOptions from it, so each value is checked once and
its error line names the flag as the user typed it; the capture stage below never sees a flag.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Callable, Iterable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias, TypeVar

import typer

from itlaudit.errors import ClusterError, ScenarioError
from itlaudit.model import vocabulary
from itlaudit.model.access import Access, api_key_header, header_problem, tls_problem
from itlaudit.model.datasets import DATASET_KINDS
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.scenario import ScenarioFlags
from itlaudit.model.vocabulary import DEFAULT_STAMP, StampMode
from itlaudit.telemetry.defaults import DEFAULT_PERIOD_S

if TYPE_CHECKING:  # the capture stage (numpy behind it) loads when a command runs, not for its --help
    from itlaudit.capture.runner import CaptureOptions
    from itlaudit.telemetry.window import Telemetry

T = TypeVar("T")


# --- Choices ---------------------------------------------------------------------------------------


def choices(name: str, values: Iterable[str]) -> type[StrEnum]:
    """A choice type read from a registry or a tuple of names: typer lists it in --help and refuses
    any other value. Its members are str, so commands take the value as a plain string."""
    return StrEnum(name, [(value, value) for value in values])  # type: ignore[return-value]


# typer takes the vocabulary's enums themselves; a registry's names (the dataset kinds) become a choice.
Endpoint = vocabulary.Endpoint
QualityGate = vocabulary.QualityGate
if TYPE_CHECKING:  # members are str at run time too
    DatasetName: TypeAlias = str
else:
    DatasetName = choices("DatasetName", DATASET_KINDS)


CAPTURE = "Capture and access"
WATCH = "Server telemetry"

# --- Servers ---------------------------------------------------------------------------------------


def parse_url(text: str, given: str) -> str:
    """A server's base URL; one without a scheme (`localhost:8000`) is named as such, not as
    unreachable. `given` is the option as typed, for the error line."""
    if not text.startswith(("http://", "https://")):
        raise ScenarioError(f"{given}: URL needs http:// or https:// (e.g. http://{text})")
    return text.rstrip("/")


ONLY_HELP = "Run only this variant of the scenario (repeat; in this order)."


def _json_object(option: str, text: str | None) -> JSONObject:
    """A JSON object given on the command line (vllm bench serve's --extra-body), or one line saying
    what is wrong with it."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ScenarioError(f"{option} {text!r}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ScenarioError(f"{option} {text!r}: give a JSON object, e.g. '{{\"top_k\": 20}}'")
    return value


def parse_variant_urls(pairs: list[str]) -> dict[str, str]:
    """--variant NAME=URL, repeated: one server per variant (the same syntax in every command)."""
    urls: dict[str, str] = {}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or not name or not url:
            raise ScenarioError(f"--variant {pair!r}: expected NAME=http://HOST:PORT")
        urls[name] = parse_url(url, f"--variant {pair!r}")
    return urls


ScenarioArgument = Annotated[
    Path | None,
    typer.Argument(
        metavar="SCENARIO",
        help="Scenario TOML file (see scenarios/); without one, the workload comes from the flags.",
        show_default=False,
    ),
]

UrlOption = Annotated[
    str | None, typer.Option(metavar="URL", help="Send every variant to this server (http://HOST:PORT).")
]
VariantOption = Annotated[
    list[str] | None,
    typer.Option(metavar="NAME=URL", help="The server for variant NAME (repeat for each variant)."),
]


# --- Output ----------------------------------------------------------------------------------------

PlotsOption = Annotated[
    bool,
    typer.Option(
        "--plots/--no-plots",
        help="--no-plots: write report.md and report.html without their PNG plots (the report says so): "
        "the seconds of loading matplotlib and drawing are not spent.",
    ),
]

# --trials N|auto and its rule's flags, the same on `run` and `sweep` (analysis.convergence.trials_settings
# reads them).
FailOnFindingsOption = Annotated[
    bool, typer.Option("--fail-on-findings", help="Exit 1 when any finding fires (comparison findings too).")
]
# --trials and --max-trials mean the same on run, compare, sweep and bisect: a count, or auto (until the
# figures are clear), bounded by one default.
TRIALS_HELP = (
    "Trials: N, or auto: until the figures are clear, at most --max-trials (run/compare/sweep: the 95% CI "
    "of each mean p50 token ITL is --ci-width % of it wide, 3 at least; bisect: a probe's verdict, "
    "3 at least for a timing judge)."
)
MAX_TRIALS_HELP = "--trials auto: the most trials (bisect: an unclear probe then counts as unknown)."
TrialsOption = Annotated[str, typer.Option(metavar="N|auto", help=TRIALS_HELP)]
CiWidthOption = Annotated[
    float, typer.Option(metavar="PCT", help="--trials auto: the interval's width, % of the mean.")
]
MaxTrialsOption = Annotated[int, typer.Option(metavar="N", help=MAX_TRIALS_HELP)]
CooldownOption = Annotated[float, typer.Option(metavar="S", help="Seconds the server idles between trials.")]


# --- Capture and access ----------------------------------------------------------------------------

WorkersOption = Annotated[
    str,
    typer.Option(
        metavar="N|auto",
        help="Capture processes: N, or auto (enough for the concurrency, at most the cores).",
        rich_help_panel=CAPTURE,
    ),
]
StampOption = Annotated[
    StampMode,
    typer.Option(
        help="Chunk arrival time: kernel (the socket's receive time; loop where unsupported) or loop.",
        rich_help_panel=CAPTURE,
    ),
]


def cluster_option(panel: str) -> Any:
    """--cluster, for capture (run, compare, sweep, selfcheck) and for bisect's probes alike."""
    return typer.Option(
        metavar="WHERE",
        help="none: on this host; ray or auto: the running Ray cluster (capture actors with --workers in "
        "all, or one GPU task per bisect probe); ray://HOST:PORT: that cluster.",
        rich_help_panel=panel,
    )


ClusterOption = Annotated[str, cluster_option(CAPTURE)]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        metavar="KEY",
        help="Sent as Authorization: Bearer (default: $OPENAI_API_KEY, else $VLLM_API_KEY).",
        rich_help_panel=CAPTURE,
    ),
]
HeaderOption = Annotated[
    list[str] | None,
    typer.Option(
        "--header",
        metavar="'NAME: VALUE'",
        help="Header sent with every request (repeatable).",
        rich_help_panel=CAPTURE,
    ),
]
InsecureOption = Annotated[
    bool, typer.Option("--insecure", help="https without checking the certificate.", rich_help_panel=CAPTURE)
]
CaCertOption = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE", help="PEM bundle to verify the server's certificate.", rich_help_panel=CAPTURE
    ),
]


def _timeout(what: str, key: str) -> Any:
    return typer.Option(
        metavar="SECONDS", help=f"Seconds {what} (overrides the scenario's {key}).", rich_help_panel=CAPTURE
    )


def access(api_key: str | None, headers: list[str] | None, insecure: bool, ca_cert: Path | None) -> Access:
    """What every request carries: the API key as Authorization, then each --header as given. Every
    header and the TLS material are checked here, so a bad one is one line before anything is sent or
    any run folder is made."""
    pairs: list[tuple[str, str]] = []
    bearer = api_key_header(api_key, os.environ)
    if bearer is not None:
        pairs.append(bearer)
    for text in headers or []:
        name, sep, value = text.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise ScenarioError(
                f"--header {name!r}...: expected 'Name: value' (a header name, a colon, a value)"
            )
        problem = header_problem(name, value)
        if problem is not None:
            raise ScenarioError(f"--header {name!r}: {problem}")
        pairs.append((name, value))
    if ca_cert is not None:
        problem = tls_problem(str(ca_cert))
        if problem is not None:
            raise ScenarioError(f"--ca-cert {ca_cert}: {problem}")
    return Access(headers=(), insecure=insecure, ca_cert=str(ca_cert) if ca_cert else None).with_headers(
        dict(pairs)
    )


def capture_options(
    workers: WorkersOption = "auto",
    stamp: StampOption = DEFAULT_STAMP,
    cluster: ClusterOption = "none",
    connect_timeout: Annotated[
        float | None, _timeout("to open the TCP connection", "connect_timeout_s")
    ] = None,
    ttft_timeout: Annotated[float | None, _timeout("to the first token", "ttft_timeout_s")] = None,
    stall_timeout: Annotated[
        float | None, _timeout("of silence allowed between chunks", "stall_timeout_s")
    ] = None,
    request_timeout: Annotated[
        float | None, _timeout("a whole request may take", "request_timeout_s")
    ] = None,
    api_key: ApiKeyOption = None,
    header: HeaderOption = None,
    insecure: InsecureOption = False,
    ca_cert: CaCertOption = None,
    metrics_period: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="Seconds between scrapes of the server's /metrics during the measured requests.",
            rich_help_panel=WATCH,
        ),
    ] = DEFAULT_PERIOD_S,
    no_server_metrics: Annotated[
        bool, typer.Option("--no-server-metrics", help="Do not sample /metrics.", rich_help_panel=WATCH)
    ] = False,
    gpu: Annotated[
        str | None,
        typer.Option(
            metavar="N[,N...]",
            help="GPUs on this host to read through NVML (default: those of a server launched here).",
            rich_help_panel=WATCH,
        ),
    ] = None,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Call the server's /start_profile before the measured requests and /stop_profile after.",
            rich_help_panel=WATCH,
        ),
    ] = False,
    dcgm_url: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="A dcgm-exporter's /metrics to read GPU telemetry from, in NVML's place.",
            rich_help_panel=WATCH,
        ),
    ] = None,
) -> CaptureOptions:
    """How requests are sent and their chunks stamped: the same options in every command that streams."""
    from itlaudit.telemetry.window import Telemetry

    return build_capture(
        workers=workers,
        stamp=stamp,
        cluster=cluster,
        timeouts={
            "connect_timeout_s": connect_timeout,
            "ttft_timeout_s": ttft_timeout,
            "stall_timeout_s": stall_timeout,
            "request_timeout_s": request_timeout,
        },
        access=access(api_key, header, insecure, ca_cert),
        telemetry=Telemetry.from_flags(metrics_period, no_server_metrics, gpu, profile, dcgm_url),
    )


def trial_capture_options(
    workers: WorkersOption = "auto",
    stamp: StampOption = DEFAULT_STAMP,
    api_key: ApiKeyOption = None,
    header: HeaderOption = None,
) -> CaptureOptions:
    """How a bisection's trials and a smoke suite's passes send and stamp: run's options of the same
    names (bisect's own --cluster places whole probes, not capture workers)."""
    return build_capture(workers=workers, stamp=stamp, access=access(api_key, header, False, None))


def parse_cluster(value: str) -> str | None:
    """`--cluster`: none (local processes), `ray` or `auto` (the running cluster: RAY_ADDRESS, else the
    one `ray start` made on this machine), or `ray://HOST:PORT` (a remote cluster's client port); for
    capture workers and bisect's probes alike."""
    if value == "none":
        return None
    if value in ("ray", "auto"):
        return "auto"
    if value.startswith("ray://") and len(value) > len("ray://"):
        return value
    raise ClusterError(f"--cluster {value!r}: use none, ray (or auto), or ray://HOST:PORT")


def _workers(text: str) -> int | None:
    if text == "auto":
        return None
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ScenarioError(f"--workers {text!r}: give a positive number of processes, or auto")


def build_capture(
    *,
    workers: str = "auto",
    stamp: StampMode = DEFAULT_STAMP,
    cluster: str = "none",
    timeouts: dict[str, float | None] | None = None,
    access: Access | None = None,
    telemetry: Telemetry | None = None,
) -> CaptureOptions:
    """The one builder of CaptureOptions, from the flags' values (typer has already refused a --stamp
    outside StampMode): `--workers auto|N`, `--cluster` (Ray imported here when asked for, so a
    missing Ray is one line before any server starts), and each `--*-timeout` against the bound of
    the scenario key it overrides (`timeouts` by that key; None: not given)."""
    # Not at the top: the capture stack (numpy, the workers) stays off `itlaudit --help`'s path.
    from itlaudit.capture.cluster import import_ray
    from itlaudit.capture.runner import CaptureOptions
    from itlaudit.model.workload import BOUNDS
    from itlaudit.telemetry.window import Telemetry

    given = {key: value for key, value in (timeouts or {}).items() if value is not None}
    for key, value in given.items():
        problem = BOUNDS[key].problem(value)
        if problem is not None:
            raise ScenarioError(f"--{key.removesuffix('_s').replace('_', '-')} {value:g}: {problem}")
    address = parse_cluster(cluster)
    if address is not None:
        import_ray()
    return CaptureOptions(
        workers=_workers(workers),
        timeouts=given,
        stamp=stamp,
        access=access or Access(),
        cluster=address,
        telemetry=telemetry or Telemetry(),
    )


# --- Workload, as vllm bench serve's flags name it -------------------------------------------------


WORKLOAD = "Workload (vllm bench serve's flags)"


def _bench(help_text: str, metavar: str | None = None, **kwargs: Any) -> Any:
    """No ranges here: each flag sets a scenario key, and the scenario parser checks every key against
    its bound (model/workload.py BOUNDS), naming the flag and the range in one line, nan and inf too."""
    return typer.Option(metavar=metavar, help=help_text, rich_help_panel=WORKLOAD, **kwargs)


def _floor(help_text: str, metavar: str) -> Any:
    """The memory-bandwidth floor's flags (analysis.roofline), with the verdicts they inform."""
    return typer.Option(metavar=metavar, help=help_text, rich_help_panel="Verdicts")


def workload_flags(
    url: UrlOption = None,
    variant: VariantOption = None,
    model: Annotated[
        str | None, _bench("Served model to send (default: the scenario's, else the first served).", "NAME")
    ] = None,
    endpoint: Annotated[
        Endpoint | None, _bench("API: /v1/completions, /v1/chat/completions or SGLang's native /generate.")
    ] = None,
    dataset_name: Annotated[
        DatasetName | None,
        _bench("Prompts: random token ids, or a file: JSONL, ShareGPT, trace, SpecBench, SPEED-Bench."),
    ] = None,
    random_input_len: Annotated[int | None, _bench("Prompt tokens per random request.", "N")] = None,
    random_output_len: Annotated[
        int | None, _bench("Tokens each random request generates (ignore_eos).", "N")
    ] = None,
    random_range_ratio: Annotated[
        str | None,
        _bench("Random lengths drawn uniformly within ±R of --random-input-len/--random-output-len.", "R"),
    ] = None,
    random_prefix_len: Annotated[
        int | None,
        _bench("Random tokens before every random prompt, the same for all (prefix caching).", "N"),
    ] = None,
    dataset_path: Annotated[
        Path | None, _bench("The dataset's file (speed_bench: its folder).", "FILE")
    ] = None,
    num_prompts: Annotated[int | None, _bench("Requests to send.", "N")] = None,
    max_concurrency: Annotated[int | None, _bench("Most requests open at once.", "N")] = None,
    request_rate: Annotated[
        float | None, _bench("Requests per second (Poisson arrivals); inf: all at once.", "RATE")
    ] = None,
    burstiness: Annotated[
        float | None, _bench("Gamma shape of the arrivals: 1 is Poisson, lower is burstier.", "B")
    ] = None,
    num_warmups: Annotated[int | None, _bench("Warmup requests, left out of the figures.", "N")] = None,
    ignore_eos: Annotated[bool | None, _bench("Generate max_tokens whatever the model's EOS says.")] = None,
    temperature: Annotated[float | None, _bench("Sampling temperature (0: greedy).", "T")] = None,
    max_tokens: Annotated[int | None, _bench("Most tokens per request.", "N")] = None,
    seed: Annotated[int | None, _bench("Seed for random prompts, arrivals and sampling.", "N")] = None,
    extra_body: Annotated[
        str | None,
        _bench("JSON merged into every request's body (sampling options: top_p, top_k, …).", "JSON"),
    ] = None,
    goodput: Annotated[
        str | None,
        _bench("SLOs a request must meet to count as goodput: 'ttft:500 tpot:20' or 'tpot_ms=20'.", "SLOS"),
    ] = None,
    metric_percentiles: Annotated[
        str | None, _bench("Percentiles the block and the result file give (default 99).", "P,P")
    ] = None,
    percentile_metrics: Annotated[
        str | None, _bench("Metrics the block gives them for (default ttft,tpot,itl,e2el).", "M,M")
    ] = None,
    tokenizer: Annotated[
        Path | None,
        _bench(
            "A local model folder (or its tokenizer.json) that counts the tokens of a server sending "
            "no usage or token ids per chunk; a server that sends them is counted by them.",
            "PATH",
        ),
    ] = None,
    model_config: Annotated[
        Path | None,
        _floor(
            "The served model's config.json (or its folder): its bytes per decode step give each "
            "variant's memory-bandwidth floor.",
            "PATH",
        ),
    ] = None,
    mem_bandwidth: Annotated[
        float | None,
        _floor(
            "The device's memory bandwidth in GB/s, where NVML's device name is not in the table "
            "(docs/roofline.md).",
            "GBPS",
        ),
    ] = None,
    bytes_per_token: Annotated[
        float | None,
        _floor("Bytes a decode step reads per token, in place of the config.json estimate.", "BYTES"),
    ] = None,
    only: Annotated[list[str] | None, typer.Option(metavar="NAME", help=ONLY_HELP)] = None,
    quality_gate: Annotated[
        QualityGate | None,
        typer.Option(
            help="How gibberish output gates a variant's figures: relative (only where the baseline's "
            "outputs are clean; default), strict (always), off (never). Truncation and failures always gate.",
            rich_help_panel="Verdicts",
        ),
    ] = None,
) -> ScenarioFlags:
    """The servers and the workload from flags: with no scenario file they are the whole experiment,
    with one they replace the keys they name."""
    return ScenarioFlags(
        model=model,
        endpoint=endpoint,
        dataset_name=dataset_name,
        random_input_len=random_input_len,
        random_output_len=random_output_len,
        random_range_ratio=random_range_ratio,
        random_prefix_len=random_prefix_len,
        goodput=goodput,
        metric_percentiles=metric_percentiles,
        percentile_metrics=percentile_metrics,
        tokenizer=None if tokenizer is None else tokenizer.absolute(),
        model_config=None if model_config is None else model_config.absolute(),
        mem_bandwidth_gbps=mem_bandwidth,
        bytes_per_token=bytes_per_token,
        dataset_path=dataset_path,
        num_prompts=num_prompts,
        max_concurrency=max_concurrency,
        request_rate=request_rate,
        burstiness=burstiness,
        num_warmups=num_warmups,
        ignore_eos=ignore_eos,
        temperature=temperature,
        max_tokens=max_tokens,
        seed=seed,
        quality_gate=quality_gate,
        only=list(only or []),
        extra_body=_json_object("--extra-body", extra_body),
        url=parse_url(url, f"--url {url!r}") if url else None,
        variant_urls=parse_variant_urls(variant or []),
    )


# --- Adding a group to a command -------------------------------------------------------------------


def _options(function: Callable[..., Any], skip: str = "") -> list[inspect.Parameter]:
    """A function's parameters as typer reads them: keyword-only, annotations evaluated where their
    names are there at run time. A group's result type (CaptureOptions) is imported under
    TYPE_CHECKING only, so drawing a command's --help never loads the capture stage: its parameter
    keeps the name as a string until its own group's with_options takes it off."""
    namespace = getattr(function, "__globals__", {})
    return [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=_evaluated(p.annotation, namespace))
        for p in inspect.signature(function).parameters.values()
        if p.name != skip
    ]


def _evaluated(annotation: Any, namespace: dict[str, Any]) -> Any:
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, namespace)  # what inspect.signature(eval_str=True) does, one by one
    except NameError:
        return annotation


def with_options(name: str, group: Callable[..., T]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command that takes `name` the group's options as its own, after its own ones: typer reads
    the combined signature, the command gets the group's result."""
    grouped = _options(group)

    def add(command: Callable[..., None]) -> Callable[..., None]:
        own = _options(command, skip=name)

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> None:
            value = group(**{p.name: kwargs.pop(p.name) for p in grouped})
            command(**kwargs, **{name: value})

        params = [*own, *grouped]
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return add
