"""`.ci/run`'s skip check (tools/check_skips.py) and the suite's independence from paths outside the repository."""

import os
import subprocess
import sys
import textwrap
from tests.helpers.common import REPO_ROOT

ROOT = REPO_ROOT
CHECK = os.path.join(ROOT, "tools", "check_skips.py")


def run_report(tmp_path, body: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_sample.py"
    test.write_text(textwrap.dedent(body))
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test), f"--junitxml={report}",
                    "--rootdir", str(tmp_path), "-c", os.devnull], capture_output=True, text=True, timeout=120)
    return subprocess.run([sys.executable, CHECK, str(report)], capture_output=True, text=True, timeout=60)


def test_gpu_and_network_skips_pass(tmp_path):
    done = run_report(tmp_path, """
        import pytest
        def test_gpu():
            pytest.skip("needs a CUDA device")
        def test_net():
            pytest.skip("network: pip could not fetch it")
        def test_ok():
            pass
    """)
    assert done.returncode == 0, done.stderr
    assert "2 skipped, 0 for a reason other than a missing GPU or network" in done.stderr


def test_any_other_skip_fails_and_is_named(tmp_path):
    done = run_report(tmp_path, """
        import pytest
        @pytest.mark.skipif(True, reason="needs /work/models/tiny-llama")
        def test_outside():
            pass
    """)
    assert done.returncode == 1
    assert "test_outside was skipped: needs /work/models/tiny-llama" in done.stderr


def test_no_test_names_a_path_outside_the_repository():
    here = os.path.join(REPO_ROOT, "tests")
    offenders = []
    for folder, _dirs, files in os.walk(here):
        for name in files:
            if name.endswith(".py") and name != os.path.basename(__file__):
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                offenders += [f"{name}: {p}" for p in ("/work/wheels", "/work/models") if p in text]
    assert offenders == []
