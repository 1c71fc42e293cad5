"""Fail when a pytest run skipped a test for a reason other than a missing GPU or network.

    python tools/check_skips.py REPORT.xml      # a junit XML report (pytest --junitxml=REPORT.xml)

A skip is accepted when its message starts with "network:" (a download that could not be made) or
names a GPU / CUDA device; every other skip (a path outside the repository, an optional package
that the test extras should have installed, ...) is listed and the exit status is 1.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ElementTree
from typing import List, Tuple

ACCEPTED = re.compile(r"^\s*(network:|.*\b(gpu|cuda)\b)", re.IGNORECASE)


def skipped(report: str) -> List[Tuple[str, str]]:
    """``(test id, skip message)`` of every skipped test in a junit XML report."""
    out = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        for skip in case.findall("skipped"):
            message = skip.get("message") or skip.text or ""
            out.append((f"{case.get('classname')}::{case.get('name')}", message.removeprefix("Skipped: ")))
    return out


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    found = skipped(argv[0])
    bad = [(test, message) for test, message in found if not ACCEPTED.match(message)]
    for test, message in bad:
        print(f"check_skips: {test} was skipped: {message}", file=sys.stderr)
    print(f"check_skips: {len(found)} skipped, {len(bad)} for a reason other than a missing GPU or network", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
