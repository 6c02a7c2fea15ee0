"""A run folder read back as types: meta.json as `Meta`, summary.json as `RunSummary` and compare.json
as `CompareResult`, each decoded and format-checked once, the first time a reader asks for it, through
one reader.

Every command that reads a folder it did not just write (report, diff, sweep's finished trials, track,
bisect's probes, --save-result) opens it here (`workflows/run_folder.RunFolder.open` for the stages
above the store), so a damaged file is refused the same way whoever reads it: one line naming the file
(too deep to decode, not JSON, a format this itlaudit does not read, not the file's shape). A command
that has just written a folder holds the types already (`RunOutcome`) and reads nothing back.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from itlaudit.analysis.comparison import CompareResult
from itlaudit.analysis.summary import RunSummary
from itlaudit.errors import RecordsError
from itlaudit.model.formats import RECORDS_FORMAT, RECORDS_FORMAT_KEY, check_format
from itlaudit.model.meta import Meta
from itlaudit.store.rundir import COMPARE_FILE, META_FILE, SUMMARY_FILE, read_versioned


class RunFiles:
    """The typed files of the run folder at `path`, each read on first use and kept."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @cached_property
    def meta_file(self) -> Meta:
        """meta.json as written. A folder without one is OSError, one cut short (not JSON) ValueError;
        one nested too deep, in a format or records format this itlaudit does not read, or that is
        not run metadata is one ItlauditError line naming the file."""
        return Meta.from_json(self._meta_data(), self.path / META_FILE)

    def _meta_data(self) -> object:
        path = self.path / META_FILE
        data = read_versioned(path)
        check_format(path, data, key=RECORDS_FORMAT_KEY, current=RECORDS_FORMAT, readable=(RECORDS_FORMAT,))
        return data

    @property
    def meta_if_any(self) -> Meta | None:
        """meta.json, or None where there is none or it was cut short (records alone, a run that died
        before writing it); a damaged one is refused as `meta_file` refuses it."""
        try:
            return self.meta_file
        except (OSError, ValueError):
            return None

    @property
    def meta(self) -> Meta:
        """meta.json, or an empty `Meta` where there is none or it was cut short: the run's context
        then reads as unknown, as it always did."""
        return self.meta_if_any or Meta()

    @property
    def meta_as_context(self) -> Meta:
        """meta.json for a reader that derives everything from the records (report, diff): missing, cut
        short or damaged (JSON that is not run metadata: a list, null, a wrong shape), the run's context
        reads as unknown and its figures still come; a file too deep or in a format this itlaudit does
        not read is still refused in one line."""
        try:
            data = self._meta_data()
        except (OSError, ValueError):
            return Meta()
        try:
            return Meta.from_json(data, self.path / META_FILE)
        except RecordsError:
            return Meta()

    @cached_property
    def summary(self) -> RunSummary:
        """summary.json. A folder without one (a run that died before deriving) is OSError; one that
        does not decode, nests too deep, is in an unread format or is not a summary is one
        ValueError or ItlauditError line naming the file: each reader says what that means for it."""
        path = self.path / SUMMARY_FILE
        return RunSummary.from_json(read_versioned(path), path)

    @cached_property
    def compare(self) -> CompareResult | None:
        """compare.json, or None where there is none or it was cut short (another command writes it,
        so its figures are then absent); one in a format this itlaudit does not read is refused in one
        line (RecordsError), not skipped."""
        try:
            data = read_versioned(self.path / COMPARE_FILE)
        except (OSError, ValueError):
            return None
        return CompareResult.from_json(data)
