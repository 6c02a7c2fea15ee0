"""vLLM's own benchmark client, driven as `vllm bench serve` drives it, printing per-chunk arrival times.

Runs under the vLLM testbed's interpreter (it imports vllm, not itlaudit): the same TCPConnector and
ClientSession settings as vllm/benchmarks/serve.py, one `async_request_openai_completions` task per
stream behind a max-concurrency semaphore, all started at once, after the single-prompt test run that
`vllm bench serve` makes first (its response is listed under "warmup" so the grader leaves it out).
That function keeps `ttft` and the `itl` gaps between chunks that carry choices on
`time.perf_counter()` (CLOCK_MONOTONIC on Linux), so each chunk's arrival, relative to its request's
start, is ttft + the running sum of the gaps.

Usage: python vllm_client.py URL STREAMS TOKENS ID_PREFIX RESULT_JSON
"""

from __future__ import annotations

import asyncio
import json
import sys
from itertools import accumulate

import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import (
    RequestFuncInput,
    RequestFuncOutput,
    async_request_openai_completions,
)


async def main(url: str, streams: int, tokens: int, prefix: str) -> dict[str, object]:
    connector = aiohttp.TCPConnector(
        limit=streams,
        limit_per_host=streams,
        ttl_dns_cache=300,
        use_dns_cache=True,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
        force_close=False,
        ssl=False,
    )
    session = aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)
    )
    semaphore = asyncio.Semaphore(streams)

    def request(request_id: str) -> RequestFuncInput:
        return RequestFuncInput(
            prompt="vllm client",
            api_url=f"{url}/v1/completions",
            prompt_len=2,
            output_len=tokens,
            model="truth",
            ignore_eos=True,
            request_id=request_id,
        )

    async def limited(request_id: str) -> tuple[str, RequestFuncOutput]:
        async with semaphore:
            return request_id, await async_request_openai_completions(request(request_id), session)

    warmup = f"{prefix}-warmup"
    try:
        test_run = await async_request_openai_completions(request(warmup), session)
        if not test_run.success:
            raise SystemExit(f"vLLM client test run failed: {test_run.error}")
        outputs = await asyncio.gather(*(limited(f"{prefix}-{i}") for i in range(streams)))
    finally:
        await session.close()
    result = {}
    for request_id, output in outputs:
        if not output.success:
            raise SystemExit(f"vLLM client request {request_id} failed: {output.error}")
        arrivals_s = list(accumulate([output.ttft, *output.itl]))
        result[f"cmpl-{request_id}"] = {"t_ms": [t * 1000.0 for t in arrivals_s]}
    return {"responses": result, "warmup": [f"cmpl-{warmup}"]}


if __name__ == "__main__":
    base_url, n, count, id_prefix, result_path = sys.argv[1:6]
    data = asyncio.run(main(base_url, int(n), int(count), id_prefix))
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(data, f)
