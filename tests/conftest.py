"""Shared pytest setup: keep real-vLLM tests opt-in."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--vllm",
        action="store_true",
        default=False,
        help="run tests marked vllm (installs the vLLM CPU testbed on first use; minutes per module)",
    )


def _vllm_selected(config: pytest.Config) -> bool:
    markexpr = config.getoption("markexpr") or ""
    return bool(config.getoption("--vllm")) or ("vllm" in markexpr and "not vllm" not in markexpr)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _vllm_selected(config):
        return
    skip = pytest.mark.skip(reason="real vLLM test: run with --vllm or -m vllm")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
