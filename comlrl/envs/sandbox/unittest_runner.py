"""unittest-style tests in the checker, for class-level tasks such as ClassEval (standard library only).

The checker imports this file (beside it) for a job whose ``style`` is ``"unittest"``. The job's
``setup`` is the test module (trusted: the dataset's ``test`` field, after the task's imports); the
checker has executed it in the globals ``env``, next to a proxy of each of the candidate's entry
points (its class), so a test sees the test module's own names and the candidate's class, nothing
else. The job's ``tests`` are test ids ``"TestClass.test_method"`` in the order unittest's loader
runs them (the trainer lists them: ``comlrl.envs.coding.classeval.tests``).

Each test runs as unittest runs it (``TestCase.run``: setUp, the test method, tearDown, cleanups;
the class's ``setUpClass`` before its first test and ``tearDownClass`` after its last) under a
per-test alarm, and its outcome is decided here, by a result object of the checker's
(``Outcome``), never reported by the candidate: the first failure, error or timeout of the test
decides it ("fail" / "timeout"), else it passes. As in the task repository's runner (a
``TextTestResult`` subclass counting ``testsRun - failures - errors - skipped``), an expected
failure and an unexpected success count as passes and a skip as a failure. The alarm stops at the
first report, as the original's; the candidate's budget does not (``link.deadline``), so a tearDown
that calls the candidate after a timeout times out at once. After ``max_timeouts`` timeouts the
rest are not run; when the candidate stops answering or breaks the protocol, the test at hand
fails (a violation) and the rest are not run. A ``setUpClass`` that fails fails every test of its
class (the original reports one error for the class and runs none of them); module fixtures
(``setUpModule``) are not run.
"""

from __future__ import annotations

import time
import unittest


class Outcome(unittest.TestResult):
    """The outcome of one test: the first failure, error or timeout, else a pass."""

    def __init__(self, timeout_type: type, on_report) -> None:
        super().__init__()
        self.timeout_type = timeout_type
        self.on_report = on_report
        self.status = None
        self.error = None

    def note(self, status: str, error: BaseException | None = None) -> None:
        self.on_report()
        if self.status in (None, "pass"):
            self.status, self.error = status, error

    def note_error(self, error: BaseException) -> None:
        self.note("timeout" if isinstance(error, self.timeout_type) else "fail", error)

    def addSuccess(self, test) -> None:  # noqa: N802 - unittest's names
        self.note("pass")

    def addExpectedFailure(self, test, err) -> None:  # noqa: N802
        self.note("pass")

    def addUnexpectedSuccess(self, test) -> None:  # noqa: N802
        self.note("pass")

    def addFailure(self, test, err) -> None:  # noqa: N802
        self.note_error(err[1])

    def addError(self, test, err) -> None:  # noqa: N802
        self.note_error(err[1])

    def addSkip(self, test, reason) -> None:  # noqa: N802
        self.note("fail", unittest.SkipTest(reason))

    def addSubTest(self, test, subtest, err) -> None:  # noqa: N802
        if err is not None:
            self.note_error(err[1])


class Fixtures:
    """The class fixtures around each class's run of tests, under the alarm."""

    def __init__(self, alarm, seconds: float):
        self.alarm = alarm
        self.seconds = seconds
        self.current = None
        self.failed = {}  # class -> the exception its setUpClass raised

    def enter(self, cls) -> BaseException | None:
        """Leave the previous class, set up ``cls`` (once); the exception that failed it, if any."""
        if cls is not self.current:
            self.leave()
            self.current = cls
            self._call(cls, "setUpClass")
        return self.failed.get(cls)

    def leave(self) -> None:
        if self.current is not None and self.current not in self.failed:
            self._call(self.current, "tearDownClass")
        self.current = None

    def _call(self, cls, name: str) -> None:
        fixture = getattr(cls, name, None)
        if fixture is None:
            return
        try:
            self.alarm.start(self.seconds)
            fixture()
        except BaseException as error:  # noqa: BLE001 - the fixture failed, however
            if name == "setUpClass":
                self.failed[cls] = error
        finally:
            self.alarm.stop()


def run(job: dict, env: dict, link, *, alarm, report, error_fields, timeout_type: type) -> None:
    """Run the job's tests (see the module docstring); ``report(link, record)`` emits each test's
    record (False: the candidate is gone)."""
    seconds = float(job.get("test_timeout_s", 10.0))
    limit = int(job.get("max_timeouts", 3))
    fixtures = Fixtures(alarm, seconds)
    timeouts = 0
    for index, test_id in enumerate(job["tests"]):
        if timeouts >= limit or link.dead:
            break
        link.deadline = time.monotonic() + seconds
        outcome = Outcome(timeout_type, alarm.stop)
        class_name, _, method = str(test_id).partition(".")
        cls = env.get(class_name)
        try:
            if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
                raise LookupError(f"the test module defines no TestCase {class_name!r}")
            failed = fixtures.enter(cls)
            if failed is not None:
                raise failed
            case = cls(method)
            alarm.start(seconds)
            case.run(outcome)
        except BaseException as error:  # noqa: BLE001 - a timeout or error outside the test's own parts
            outcome.note_error(error)
        finally:
            alarm.stop()
        record = {"event": "test", "i": index, "status": outcome.status or "fail"}
        if outcome.error is not None:
            record.update(error_fields(outcome.error))
        timeouts += record["status"] == "timeout"
        if not report(link, record):  # the candidate went away or broke the protocol: the rest are not run
            return
    if not link.dead:
        link.deadline = time.monotonic() + seconds
        fixtures.leave()
