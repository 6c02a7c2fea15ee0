"""JUnit XML for CI: one testcase per check, failures carrying their evidence.

The flavour is the common denominator Jenkins, GitLab and GitHub test reporters all ingest:
<testsuites><testsuite><properties/><testcase classname name time><failure|skipped|error/></testcase>.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path

from itlaudit.smoke.checks import FAIL, SKIP, CheckResult


def _suite_element(
    name: str,
    properties: Mapping[str, str],
    tests: int,
    failures: int,
    errors: int,
    skipped: int,
    time_s: float,
) -> ET.Element:
    suite = ET.Element(
        "testsuite",
        name=name,
        tests=str(tests),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
        time=f"{time_s:.3f}",
    )
    props = ET.SubElement(suite, "properties")
    for key, value in properties.items():
        ET.SubElement(props, "property", name=key, value=value)
    return suite


def _write(path: Path, suite: ET.Element) -> None:
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def write_junit(
    path: Path, suite_name: str, results: Sequence[CheckResult], properties: Mapping[str, str], time_s: float
) -> None:
    failures = sum(r.status == FAIL for r in results)
    skipped = sum(r.status == SKIP for r in results)
    suite = _suite_element(
        f"itlaudit smoke: {suite_name}", properties, len(results), failures, 0, skipped, time_s
    )
    for result in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"smoke.{suite_name}.{result.scenario}",
            name=f"{result.variant}: {result.name}",
            time="0",
        )
        summary = f"{result.case} {result.name}: {result.figure} (threshold {result.threshold})"
        if result.status == FAIL:
            failure = ET.SubElement(case, "failure", message=f"{summary}: {result.message}", type=result.kind)
            failure.text = json.dumps(result.evidence, indent=2, default=str)
        elif result.status == SKIP:
            ET.SubElement(case, "skipped", message=f"{summary}: {result.message}")
        else:
            ET.SubElement(case, "system-out").text = summary
    _write(path, suite)


def write_junit_error(path: Path, suite_name: str, message: str) -> None:
    """A smoke that could not run still leaves CI a red testcase that says why (exit code 2)."""
    suite = _suite_element(f"itlaudit smoke: {suite_name}", {}, 1, 0, 1, 0, 0.0)
    case = ET.SubElement(suite, "testcase", classname=f"smoke.{suite_name}", name="smoke could run", time="0")
    ET.SubElement(case, "error", message=message, type="could_not_run")
    _write(path, suite)
