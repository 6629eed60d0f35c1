"""pytest plugin of the grader, loaded into each grading subprocess with ``-p``.

``diloco.tools.grading.grader`` copies this file next to the tests' working folder as
``_diloco_grade_plugin.py``; it is never imported by the reference package itself. It
writes one JSON record per line to the file descriptor ``$DILOCO_GRADE_RECORDS_FD`` (a
file of the grader's with no name, so nothing else can find it): the imported package,
the collected tests with their milestone marker, collection errors, and every test
outcome (with the first exception, whether it was a stub's ``NotImplementedError``, and
the last line of the graded package that ran).

In sandbox mode (``$DILOCO_GRADE_SANDBOX`` holds the sandbox's config) ``diloco`` here is
the grader's own package and the graded one runs only in the sandbox: when this module is
imported, before any test module, ``diloco.tools.sandbox.proxy.install`` routes the public
functions to the sandbox, and each test's milestone gets its own budget of sandbox restarts
(``proxy.begin``). In local mode (``--local``) ``diloco`` here is the graded package itself.
"""
import json
import os
import re

import pytest

try:  # Python >= 3.11 has BaseExceptionGroup built in
    BaseExceptionGroup  # noqa: B018
except NameError:  # pragma: no cover - Python 3.10
    class BaseExceptionGroup(BaseException):  # noqa: A001
        exceptions = ()

_OUT = int(os.environ["DILOCO_GRADE_RECORDS_FD"])
_SANDBOX = os.environ.get("DILOCO_GRADE_SANDBOX")
# A milestone's marker (m01..m30) or an optional exercise's (x01.., diloco.exercises).
_MARK = re.compile(r"^(m(0[1-9]|[12][0-9]|30)|x(0[1-9]|[1-9][0-9]))$")


def _write(record):
    data = (json.dumps(record) + "\n").encode("utf-8")
    while data:
        data = data[os.write(_OUT, data):]


if _SANDBOX:
    from diloco.tools.sandbox import proxy

    proxy.install(json.loads(_SANDBOX), notify=_write)


def pytest_configure(config):
    for number in range(1, 31):
        config.addinivalue_line("markers", f"m{number:02d}: milestone {number:02d}")
    for number in range(1, 10):
        config.addinivalue_line("markers", f"x{number:02d}: optional exercise x{number:02d}")
    config.addinivalue_line("markers", "tooling: tests of the supporting tools")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    try:  # the suite's profile without shrinking (defined in tests/conftest.py): much faster
        from hypothesis import settings
        settings.load_profile("ci-noshrink")
    except Exception:  # no hypothesis, or a tests folder that does not define the profile
        pass


def pytest_sessionstart(session):
    try:
        if _SANDBOX:
            _write({"kind": "import", "file": proxy.hello()["file"], "sandboxed": True})
        else:
            import diloco
            _write({"kind": "import", "file": diloco.__file__})
    except BaseException as exc:  # reported, the run goes on to show collection errors
        _write({"kind": "import", "error": f"{type(exc).__name__}: {exc}"})


def pytest_unconfigure(config):
    if _SANDBOX:
        proxy.shutdown()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _SANDBOX:  # each milestone (and exercise) has its own budget of sandbox restarts
        proxy.begin(_marker(item) or item.nodeid)


def _marker(item):
    names = sorted({m.name for m in item.iter_markers() if _MARK.match(m.name)})
    return names[0] if len(names) == 1 else None


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(items):
    """Each test file with the markers of its tests, in collection order, deselected tests
    included (their markers as they are once every hook has run; ``None`` for a test with no
    single one): the grader collects only the files it needs in its later waves
    (``grade_waves.wave_files``)."""
    every = list(items)
    yield
    files = {}
    for item in every:
        files.setdefault(item.nodeid.split("::", 1)[0], set()).add(_marker(item))
    _write({"kind": "files", "files": [[name, sorted(markers, key=str)] for name, markers in files.items()]})


def pytest_collection_finish(session):
    _write({"kind": "collected", "items": [[i.nodeid, _marker(i)] for i in session.items]})


def pytest_collectreport(report):
    if report.failed:
        _write({"kind": "collect_error", "nodeid": report.nodeid, "message": str(report.longrepr)[-3000:]})


def pytest_runtest_logstart(nodeid, location):
    _write({"kind": "start", "nodeid": nodeid})


def _exceptions(exc):
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return [e for sub in exc.exceptions for e in _exceptions(sub)]
    return [exc]


def _where(exc):
    """``diloco/model.py:190: exp = np.exp(logits)``: the last line of diloco code that ran."""
    import traceback
    if hasattr(exc, "_diloco_sandbox_where"):  # raised in the sandbox, which found the line
        return exc._diloco_sandbox_where
    try:
        import diloco
        package = os.path.dirname(os.path.abspath(diloco.__file__))
    except BaseException:
        return ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if os.path.abspath(frame.filename).startswith(package + os.sep):
            name = "diloco/" + os.path.relpath(frame.filename, package)
            return f"{name}:{frame.lineno}: {(frame.line or '').strip()}"
    return ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" and report.passed:
        return
    record = {"kind": "test", "nodeid": item.nodeid, "marker": _marker(item), "when": report.when,
              "outcome": report.outcome, "duration": report.duration,
              "name": getattr(item, "originalname", item.name),
              "doc": (getattr(getattr(item, "function", None), "__doc__", None) or "").strip()}
    if call.excinfo is not None and report.failed:
        excs = _exceptions(call.excinfo.value)
        first = excs[0]
        record["exc_type"] = type(first).__name__
        record["message"] = str(first)[:4000]
        record["notes"] = [str(n)[:500] for n in getattr(first, "__notes__", [])][:5]
        record["stubs"] = [str(e) for e in excs if type(e) is NotImplementedError]  # a milestone's or exercise's
        record["all_stub"] = all(type(e) is NotImplementedError for e in excs)
        record["where"] = _where(first)
        if type(first).__name__ == "AssertionError" and not str(first).strip():
            record["message"] = str(report.longrepr).strip().splitlines()[-1][:500]
    _write(record)
