"""Drives one variant's requests against one server and lands each finished record on disk.

I/O only: the figures on each line come from `summary.request_line`, a pure function.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from itlaudit.client import fetch_models, stream_request
from itlaudit.errors import ServerRejectedError
from itlaudit.records import STATUS_HTTP_ERROR, RecordWriter, RequestRecord
from itlaudit.scenario import Scenario
from itlaudit.summary import request_line

OnDone = Callable[[RequestRecord], None]


async def resolve_model(session: aiohttp.ClientSession, base_url: str, wanted: str) -> str:
    """`auto` is the first served model; a named model must be served, or nothing would be measured."""
    served = await fetch_models(session, base_url)
    if not served:
        raise ServerRejectedError(f"{base_url}/v1/models lists no model; is the server fully started?")
    if wanted == "auto":
        return served[0]
    if wanted not in served:
        raise ServerRejectedError(
            f"model {wanted!r} is not served at {base_url} (served: {', '.join(served)}); "
            'fix `model` in the scenario or use model = "auto"'
        )
    return wanted


async def run_variant(
    scenario: Scenario,
    variant: str,
    base_url: str,
    writer: RecordWriter,
    on_done: OnDone | None = None,
    timeout_s: float = 600.0,
) -> list[RequestRecord]:
    """Run the workload at the scenario's concurrency; a request's line is written before its slot
    is released, so at most `concurrency` requests are ever unrecorded."""
    workload = scenario.workload
    connector = aiohttp.TCPConnector(limit=workload.concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        model = await resolve_model(session, base_url, scenario.model)
        slots = asyncio.Semaphore(workload.concurrency)
        records: list[RequestRecord] = []
        rejected: list[RequestRecord] = []

        async def one(index: int) -> None:
            async with slots:
                if rejected:
                    return
                record = await stream_request(
                    session,
                    base_url=base_url,
                    endpoint=scenario.endpoint,
                    model=model,
                    prompt=scenario.prompt_for(index),
                    params=workload.params,
                    request_id=f"{variant}-{index:05d}",
                    variant=variant,
                    extra_body=workload.extra_body or None,
                    timeout_s=timeout_s,
                )
                writer.write(request_line(record))
                records.append(record)
                if record.status == STATUS_HTTP_ERROR and 400 <= (record.http_status or 0) < 500:
                    rejected.append(record)
                if on_done is not None:
                    on_done(record)

        await asyncio.gather(*(one(i) for i in range(workload.num_requests)))
    if rejected and len(rejected) == len(records):
        first = rejected[0]
        raise ServerRejectedError(
            f"{base_url} rejected the request with HTTP {first.http_status}: {first.error} "
            "(fix the scenario's workload; the rejected request is kept in requests.jsonl)"
        )
    return sorted(records, key=lambda r: r.request_id)
