"""The experiment ledger as `run` and `compare` use it (store/ledger.py keeps the lines): each variant
fingerprinted before it is measured, a repeat named, and the finished run recorded."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from itlaudit.analysis.summary import RunSummary
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord
from itlaudit.model.scenario import Scenario
from itlaudit.serve.environment import gpus as host_gpus

if TYPE_CHECKING:
    from itlaudit.capture.server_info import ServerIdentity


@dataclass(frozen=True)
class LedgerPolicy:
    """The experiment ledger as `run`/`compare` use it: a repeat is named (with the diff that compares
    it), and refused only with `no_repeat`."""

    path: Path
    no_repeat: bool = False

    def check(
        self,
        scenario: Scenario,
        variant: str,
        base_url: str,
        identity: ServerIdentity,
        run_dir: Path,
        console: Console | None,
    ) -> JSONObject:
        """Fingerprint the variant's server from its identity (read by the variant's pass before its
        /metrics window opens: the identity ping is a request of itlaudit's own and must not count in
        the server's figures); a repeat is named, or refused with no_repeat."""
        from itlaudit.store import ledger

        if identity.get("unknown") and console is not None:
            console.print(
                f"{variant}: server build unknown ({identity['unknown']})", markup=False, soft_wrap=True
            )
        launched = next(v for v in scenario.variants if v.name == variant).launch is not None
        fingerprint = ledger.variant_fingerprint(
            scenario, variant, identity, os.environ, url=base_url, gpus=host_gpus() if launched else None
        )
        earlier = ledger.check_new_run(fingerprint, self.path, no_repeat=self.no_repeat)
        if earlier is not None and console is not None:
            console.print(
                ledger.repeat_warning(earlier, variant, run_dir),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        return fingerprint.to_json()

    def record(self, run_dir: Path, summary: RunSummary, records: list[RequestRecord]) -> None:
        """The finished run's lines, from the summary and records its one derivation gave."""
        from itlaudit.store import ledger

        ledger.record_run(run_dir, self.path, environ=os.environ, summary=summary, records=records)
