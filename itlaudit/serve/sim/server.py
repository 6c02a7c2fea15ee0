"""The aiohttp application: request handlers, streaming and non-streaming responses, fault endings."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager, suppress
from dataclasses import asdict
from http import HTTPStatus
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from itlaudit.errors import LaunchError, SimError
from itlaudit.model.jsonvalue import JSONObject, JSONValue, ReadOnlyJSON
from itlaudit.model.sendlog import SendLog
from itlaudit.model.stop import requested
from itlaudit.serve.sim.config import SGLANG, SIM_VERSION, SimConfig
from itlaudit.serve.sim.endpoints import ChatApi, CompletionApi, EndpointApi
from itlaudit.serve.sim.engine import Engine, Step
from itlaudit.serve.sim.metrics import MetricsCollector
from itlaudit.serve.sim.sglang import (
    SGLangMetrics,
    complete_generate,
    generate_request,
    info_routes,
    openai_choice,
    stream_generate,
)
from itlaudit.serve.sim.validation import parse_job
from itlaudit.serve.sim.wire import (
    DONE_FRAME,
    ENGINE_DEAD_FRAME,
    ENGINE_DEAD_MESSAGE,
    ResponseContext,
    bad_request,
    chunk_envelope,
    dump_json,
    error_body,
    full_usage_info,
    model_list,
    rejection_body,
    sse_frame,
    usage_info,
)

_ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
_SEND_LOG: web.AppKey[SendLog] = web.AppKey("send_log", SendLog)


def _json_response(obj: ReadOnlyJSON, status: int = 200) -> web.Response:
    """Starlette's JSONResponse layout, which vLLM uses for every non-streaming body."""
    return web.Response(
        body=dump_json(obj).encode(), status=status, headers={"Content-Type": "application/json"}
    )


def _reached(limit: int | None, count: int) -> bool:
    return limit is not None and count >= limit


async def _stream(
    request: web.Request, api: EndpointApi, ctx: ResponseContext, engine: Engine
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    # A client that goes away mid-stream just ends the request, as vLLM aborts it.
    with suppress(ConnectionResetError):
        await _write_stream(request, resp, api, ctx, engine)
    return resp


async def _write_stream(
    request: web.Request, resp: web.StreamResponse, api: EndpointApi, ctx: ResponseContext, engine: Engine
) -> None:
    cfg, job = engine.config, ctx.job
    send_log = request.app.get(_SEND_LOG)
    emitted = 0
    async with aclosing(engine.generate(job)) as steps:
        async for step in steps:
            if emitted == 0:
                for chunk in api.opening_chunks(ctx):
                    await resp.write(sse_frame(chunk))
            first = emitted == 0
            emitted += len(step.token_ids)
            usage = api.chunk_usage(len(job.prompt_token_ids), emitted) if job.continuous_usage else None
            # vLLM stamps the fingerprint on the terminal chunk only when no usage chunk follows.
            fingerprint = ctx.fingerprint if step.finish_reason and not job.include_usage else None
            choice = api.stream_choice(ctx, step, first)
            if cfg.dialect == SGLANG:
                choice = openai_choice(choice)
            await resp.write(sse_frame(chunk_envelope(ctx, api.chunk_object, [choice], usage, fingerprint)))
            if send_log is not None:
                send_log.record(ctx.request_id, step.due_ns, time.monotonic_ns(), emitted)
            if _reached(cfg.reset_after_tokens, emitted) and request.transport:
                request.transport.abort()
                return
            if _reached(cfg.error_after_tokens, emitted) and not step.finish_reason:
                # As in vLLM, the exception path skips the usage-only chunk but still sends [DONE].
                await resp.write(ENGINE_DEAD_FRAME)
                break
        else:
            if job.include_usage:
                usage = usage_info(len(job.prompt_token_ids), emitted)
                tail = _per_request_metrics(cfg, step if emitted else None)
                await resp.write(
                    sse_frame(chunk_envelope(ctx, api.chunk_object, [], usage, ctx.fingerprint, **tail))
                )
    if not cfg.no_done:
        await resp.write(DONE_FRAME)
    await resp.write_eof()


def _per_request_metrics(cfg: SimConfig, last: Step | None) -> JSONObject:
    """The usage chunk's `metrics` (vLLM's --per-request-spec-decode-metrics summary), when on."""
    if not cfg.per_request_spec_metrics or last is None or last.spec_decode is None:
        return {}
    return {"metrics": {"speculative_decoding": last.spec_decode.to_dict(lie=cfg.spec_metrics_lie)}}


async def _complete_row(
    request: web.Request, api: EndpointApi, ctx: ResponseContext, engine: Engine
) -> tuple[JSONObject, int] | web.Response:
    """One engine request run to the end: its choice and token count, or the response a fault ends the
    request with."""
    cfg = engine.config
    text, token_ids, logprobs = "", [], []
    last = Step(token_ids=[], text="")
    async with aclosing(engine.generate(ctx.job)) as steps:
        async for last in steps:
            text += last.text
            token_ids += last.token_ids
            logprobs += last.logprobs
            if _reached(cfg.reset_after_tokens, len(token_ids)) and request.transport:
                request.transport.abort()
                return web.Response()
            if _reached(cfg.error_after_tokens, len(token_ids)) and not last.finish_reason:
                status = HTTPStatus.INTERNAL_SERVER_ERROR
                body = error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", None, status)
                return _json_response(body, status)
    choice = api.full_choice(ctx, text, token_ids, last, logprobs)
    return (openai_choice(choice) if cfg.dialect == SGLANG else choice), len(token_ids)


async def _complete(
    request: web.Request, api: EndpointApi, ctxs: list[ResponseContext], engine: Engine
) -> web.StreamResponse:
    """Rows run concurrently and are merged as vLLM merges a prompt list: choice i is prompt i, usage
    is summed, and the first row a fault ends decides the response."""
    ctx = ctxs[0]
    rows = await asyncio.gather(*(_complete_row(request, api, row_ctx, engine) for row_ctx in ctxs))
    choices: list[JSONValue] = []
    completion_tokens = 0
    for index, row in enumerate(rows):
        if isinstance(row, web.Response):
            return row
        choice, tokens = row
        choices.append({**choice, "index": index})
        completion_tokens += tokens
    prompt_tokens = sum(len(row_ctx.job.prompt_token_ids) for row_ctx in ctxs)
    body: JSONObject = {
        "id": ctx.request_id,
        "object": api.full_object,
        "created": ctx.created,
        "model": ctx.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": ctx.fingerprint,
        "usage": full_usage_info(prompt_tokens, completion_tokens),
        **api.full_extra(ctx),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
    return _json_response(body)


def _handler(api: EndpointApi) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        engine = request.app[_ENGINE]
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise bad_request("request body must be a JSON object", "body")
            jobs = [parse_job(api, row, engine.config) for row in api.rows(body)]
            if len(jobs) > 1 and jobs[0].stream:
                raise bad_request(
                    "the simulator streams a single prompt; send a list without stream", "prompt"
                )
        except json.JSONDecodeError as exc:
            return _json_response(
                rejection_body(bad_request(f"invalid JSON: {exc}", "body")), HTTPStatus.BAD_REQUEST
            )
        except SimError as exc:
            return _json_response(rejection_body(exc), exc.status)
        request_id = request.headers.get("X-Request-Id") or f"{uuid.uuid4().int & (2**64 - 1):016x}"
        created = int(time.time())
        ctxs = [
            ResponseContext(
                request_id=f"{api.id_prefix}{request_id}",
                created=created,
                model=engine.config.model,
                fingerprint=engine.config.system_fingerprint,
                job=job,
                prompt_logprobs=engine.prompt_logprobs(job),
            )
            for job in jobs
        ]
        await engine.load.admit(jobs)
        engine.in_flight += len(ctxs)
        try:
            if jobs[0].stream:
                return await _stream(request, api, ctxs[0], engine)
            return await _complete(request, api, ctxs, engine)
        finally:
            engine.in_flight -= len(ctxs)
            await engine.load.release(jobs)

    return handle


async def _generate(request: web.Request) -> web.StreamResponse:
    """SGLang's native /generate (serve/sim/sglang.py), admitted and counted as the OpenAI routes are."""
    engine = request.app[_ENGINE]
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise bad_request("request body must be a JSON object", "body")
        asked = generate_request(body, engine.config)
    except json.JSONDecodeError as exc:
        return _json_response(
            rejection_body(bad_request(f"invalid JSON: {exc}", "body")), HTTPStatus.BAD_REQUEST
        )
    except SimError as exc:
        return _json_response(rejection_body(exc), exc.status)
    started = time.time()
    await engine.load.admit(asked.jobs)
    engine.in_flight += len(asked.jobs)
    try:
        if asked.jobs[0].stream:
            with suppress(ConnectionResetError):
                return await stream_generate(request, engine, asked, started)
            return web.Response()
        return _json_response(await complete_generate(engine, asked, started))
    finally:
        engine.in_flight -= len(asked.jobs)
        await engine.load.release(asked.jobs)


def _static(body: JSONObject) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def answer(request: web.Request) -> web.Response:
        return _json_response(body)

    return answer


async def _models(request: web.Request) -> web.Response:
    return _json_response(model_list(request.app[_ENGINE].config))


async def _version(request: web.Request) -> web.Response:
    return _json_response({"version": SIM_VERSION})


async def _health(request: web.Request) -> web.Response:
    return web.Response()


def make_app(config: SimConfig, send_log: SendLog | None = None) -> web.Application:
    """The simulator as an aiohttp application, for embedding or for aiohttp's test client. With a send
    log, each streamed content chunk's due and actual send time is recorded in it (the truth server's
    format, so `itlaudit.analysis.fidelity` can grade a client against the simulator too)."""
    engine = Engine(config)
    registry = CollectorRegistry(auto_describe=True)
    sglang = config.dialect == SGLANG
    registry.register(SGLangMetrics(engine) if sglang else MetricsCollector(engine))

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app[_ENGINE] = engine
    if send_log is not None:
        app[_SEND_LOG] = send_log
    app.router.add_post("/v1/completions", _handler(CompletionApi()))
    app.router.add_post("/v1/chat/completions", _handler(ChatApi()))
    app.router.add_get("/v1/models", _models)
    if sglang:  # SGLang has no /version: its info endpoints, and its native stream
        app.router.add_post("/generate", _generate)
        for path, body in info_routes(config):
            app.router.add_get(path, _static(body))
    else:
        app.router.add_get("/version", _version)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", metrics)
    return app


@asynccontextmanager
async def run_sim(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0, send_log: SendLog | None = None
) -> AsyncIterator[str]:
    """Serve in the current event loop for the duration of the block; yields the base URL.

    ``port=0`` lets the OS pick a free port, so parallel tests never collide.
    """
    runner = web.AppRunner(make_app(config, send_log), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
        yield f"http://{url_host}:{bound_port}"
    finally:
        await runner.cleanup()


def serve(
    config: SimConfig, host: str = "127.0.0.1", port: int = 8000, send_log_path: Path | None = None
) -> None:
    """Blocking entry point for ``itlaudit sim``; returns when interrupted, then writes the send log.
    The port is bound here, before aiohttp starts, so a busy or forbidden one is one line (LaunchError)
    rather than a traceback out of the event loop."""
    send_log = None if send_log_path is None else SendLog(server={"kind": "sim", **asdict(config)})
    try:
        sock = socket.create_server((host, port), family=_family(host))
    except OSError as exc:
        raise LaunchError(
            f"sim cannot listen on {host}:{port}: {os.strerror(exc.errno) if exc.errno else exc}; "
            "give a free --port (or another --host)"
        ) from None
    app = make_app(config, send_log)
    app.on_startup.append(_stop_if_asked)
    web.run_app(app, sock=sock, access_log=None)
    if send_log is not None and send_log_path is not None:
        send_log.write(send_log_path)


async def _stop_if_asked(app: web.Application) -> None:
    """A SIGINT or SIGTERM that came before aiohttp took the signals over (they are its own once
    `run_app` sets up, just before this startup hook) was only recorded (model.stop): act on it
    now, as aiohttp would have, instead of serving on. The CLI then ends in 130/143."""
    if requested():
        raise web.GracefulExit


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
