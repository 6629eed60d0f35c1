"""The proxy the milestone tests import through when the grader runs in sandbox mode.

``install(config)`` replaces every public function of the grader's own ``diloco``
modules (``PROXIED_MODULES``: the 30 milestones and the other public functions of those
modules, such as ``adamw_step`` or ``load_digits``, and the modules the optional exercises
stub, such as ``core.quantize``) with a proxy of the same name. The
grading plugin calls it before any test module is imported, so ``from diloco.model import
softmax`` in a test gets the proxy. The classes stay the grader's: the records on the list
of ``wire_names.RECORDS`` (NamedTuples, config dataclasses, ``OneHot``) cross as their
fields and are rebuilt by the grader's own constructors (``wire_values``); a reply that is
anything but plain data is a malformed reply (``wire_decode``), which fails the call.

A call to a proxy sends its arguments, plus the caller's ``numpy.errstate``, to the
sandbox (``diloco.tools.sandbox.box``), where the graded package runs the function of the same
name. What comes back is applied as if the call had run here:

* the return value, arrays sharing memory with the arguments where they did there;
* the arguments as they are after the call (in-place changes are made to the caller's
  own arrays, dicts and lists, so purity tests still see them);
* each Generator's new state, set on the caller's Generator;
* or the exception, raised again as the same builtin class (``ValueError``,
  ``NotImplementedError``, ...) with its message, the graded package's traceback as a
  note and the line that raised it (``exc._diloco_sandbox_where``, for the grader);
* the warnings it raised, raised again here.

A callable argument (``on_round=seen.append``) stays here: the sandbox asks for each call.
When the sandbox dies, exits, hangs or answers nonsense, the call raises ``SandboxError``
(a ``BaseException``) and the test fails. The worker is then restarted for the next test,
at most ``MAX_STARTS`` times per milestone (``begin``), and not at all for a milestone whose
call ran out of time. Each milestone starts a worker of its own. So the process that runs the tests and records
their outcomes never imports the graded package.
"""

from __future__ import annotations

import atexit
import builtins
import importlib
import inspect
import sys
import warnings

import numpy as np

from diloco.tools.sandbox.box import Sandbox, SandboxError, full_note
from diloco.tools.sandbox.wire import Registry, WireError, describe_exception, rebuild_exception
from diloco.tools.sandbox.wire_values import Decoder, Encoder, Names, snapshot

__all__ = ["PROXIED_MODULES", "MAX_STARTS", "SandboxError", "install", "begin", "hello", "call", "shutdown"]

PROXIED_MODULES = ("model", "adamw", "params", "sharding", "outer", "loop", "evaluation", "data",
                   # the modules of the optional exercises (diloco.exercises)
                   "core.quantize", "core.schedule", "methods.sparse", "models.layers", "models.transformer")
MAX_STARTS = 4


class _Session:
    """The sandbox of this test run and what both sides remember about the arrays."""

    def __init__(self, config: dict, notify):
        self.config, self.notify = config, notify
        self.registry = Registry("c")
        self.names = Names(lambda module: sys.modules.get(f"diloco.{module}"))
        self.box: Sandbox | None = None
        self.hello: dict = {}
        self.starts, self.next_id = 0, 0
        # The restart budget is per scope (the milestone whose test runs, see ``begin``): a
        # milestone that keeps crashing, or runs out of time once, fails only itself.
        self.scope, self.budget, self.broken_in = "", {}, {}
        self.noted_full = False
        self.unused = False  # the worker has answered its hello and not one call yet

    def note_full(self, reply: dict) -> None:
        """Tell the grader (a ``note`` record, once) when the worker's folder ran out of files."""
        if reply.get("full") is True and not self.noted_full:
            self.noted_full = True
            if self.notify is not None:
                self.notify({"kind": "note", "text": full_note(self.config)})

    @property
    def broken(self) -> str:
        return self.broken_in.get(self.scope, "")

    def sandbox(self) -> Sandbox:
        if self.box is not None and self.box.alive():
            return self.box
        if self.box is not None:
            self.box.close()
            self.box = None
        scope, used = self.scope, self.budget.get(self.scope, 0)
        if not self.broken and used >= MAX_STARTS:
            where = scope or "this test run"
            self.broken_in[scope] = f"the sandbox failed {used} times in {where} and is not restarted"
        if self.broken:
            raise SandboxError(self.broken)
        self.starts += 1
        self.budget[scope] = used + 1
        box = Sandbox(self.config, generation=self.starts)
        try:
            hello = box.start()
        except SandboxError as exc:
            box.close()
            self.broken_in[scope] = f"the sandbox could not start: {exc}"
            raise SandboxError(self.broken) from None
        finally:
            if self.notify is not None and box.pid is not None:
                self.notify({"kind": "sandbox", "pid": box.pid})
        self.note_full(hello)
        if "error" in hello or not isinstance(hello.get("file"), str):
            box.close()
            where = f" ({hello['where']})" if hello.get("where") else ""
            self.broken_in[scope] = f"the graded package does not import in the sandbox: {hello.get('error')}{where}"
            raise SandboxError(self.broken)
        self.box, self.hello, self.unused = box, hello, True
        return box

    def hand_over(self, scope: str) -> bool:
        """Give the worker to ``scope`` when it has served no call yet (the one the plugin's hello
        started at the start of the run); whether it did.

        Such a worker has run nothing of the submission but its import, which any worker of
        ``scope`` would run first too, and has seen no argument of any test: it is what a
        worker started for ``scope`` would be. It counts as one of ``scope``'s starts, its
        CPU-time limit is still its own, and a worker that served a call is never handed on.
        """
        if not (self.unused and self.box is not None and self.box.alive()):
            return False
        self.scope = scope
        self.budget[scope] = self.budget.get(scope, 0) + 1
        return True


_session: _Session | None = None


def install(config: dict, notify=None) -> None:
    """Route the public functions of ``PROXIED_MODULES`` (and their re-exports) to the sandbox, decorated
    (cached) ones too."""
    global _session
    import diloco

    proxies = {}
    modules = [importlib.import_module(f"diloco.{name}") for name in PROXIED_MODULES]
    for module_name, module in zip(PROXIED_MODULES, modules, strict=True):
        for name in getattr(module, "__all__", ()):
            function = getattr(module, name, None)
            # a function, or one wrapped by a decorator (``functools.lru_cache``: ``models.layers.causal_mask``)
            if function is not None and inspect.isfunction(inspect.unwrap(function)) and id(function) not in proxies:
                proxies[id(function)] = (function, _proxy(f"{module_name}.{name}", function))
    for module in [diloco, *modules]:
        for name, value in list(vars(module).items()):
            if id(value) in proxies and proxies[id(value)][0] is value:
                setattr(module, name, proxies[id(value)][1])
    _session = _Session(config, notify)
    atexit.register(shutdown)


def _proxy(name: str, function):
    def proxy(*args, **kwargs):
        return call(name, args, kwargs)

    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(proxy, attribute, getattr(function, attribute, None))
    try:
        proxy.__signature__ = inspect.signature(function)
    except (TypeError, ValueError):
        pass
    proxy._diloco_sandboxed = name
    return proxy


def begin(scope: str) -> None:
    """Charge the sandbox's restarts from now on to ``scope`` (the grading plugin passes the
    marker of the test about to run): each milestone has its own ``MAX_STARTS``, and its own
    worker, so its CPU-time limit is the milestone's alone. A worker that has served no call
    yet (the hello's, at the start of a run) is handed to ``scope`` instead of started again
    (``_Session.hand_over``)."""
    if _session is not None and _session.scope != str(scope) and not _session.hand_over(str(scope)):
        shutdown()
        _session.scope = str(scope)


def hello() -> dict:
    """The sandbox's hello (``file``: the graded package it imported); ``SandboxError`` if none."""
    _session.sandbox()
    return _session.hello


def shutdown() -> None:
    """Kill the sandbox of this test run (the plugin calls it when the run ends)."""
    if _session is not None and _session.box is not None:
        _session.box.close()
        _session.box = None


def call(name: str, args: tuple, kwargs: dict):
    """Run ``name`` (``"model.softmax"``) in the sandbox as if it ran here."""
    session = _session
    box = session.sandbox()
    session.unused = False
    encoder = Encoder(session.registry, session.names, lenient=True)
    session.next_id += 1
    header = {"kind": "call", "id": session.next_id, "fn": name,
              "args": [encoder.encode(value) for value in args],
              "kwargs": {key: encoder.encode(value) for key, value in kwargs.items()},
              "errstate": np.geterr()}
    reply, blobs = _exchange(session, box, encoder, header, (args, kwargs))
    session.note_full(reply)
    value, error, caught = _read_reply(session, box, encoder, name, reply, blobs)
    for message, category, filename, lineno in caught:
        warnings.warn_explicit(message, category, filename, lineno, module="diloco")
    if error is not None:
        raise error
    return value


def _exchange(session: _Session, box, encoder: Encoder, header: dict, request: tuple) -> tuple[dict, list]:
    """Send the call and answer its callbacks until the reply. A time-out breaks the current
    scope (its other calls fail at once); any other interruption kills the half-way sandbox."""
    name = header["fn"]
    try:
        return box.exchange(header, encoder.blobs, what=f"running {name}",
                            on_callback=lambda h, b: _callback(session, encoder, request, h, b))
    except SandboxError:
        if box.timed_out:  # no more time for this milestone: its other tests fail at once
            session.broken_in.setdefault(session.scope, f"a call in {session.scope or 'this test run'} ran out of "
                                                         "time; the sandbox is not restarted for it")
        raise
    except BaseException:
        box.kill()  # a callback was interrupted: the sandbox is half-way through a call
        raise


def _read_reply(session: _Session, box, encoder: Encoder, name: str, reply: dict, blobs: list) -> tuple:
    """``(value, error, warnings)`` from the reply: the arguments' changes applied in place, the
    return value, the exception to raise again. A malformed reply kills the sandbox and is a
    ``SandboxError``."""
    try:
        kind = reply.get("kind")
        if kind == "refused":
            raise SandboxError(str(reply.get("message"))[:4000])
        if kind not in ("return", "raise"):
            raise WireError(f"a reply of kind {kind!r}")
        decoder = Decoder(session.registry, session.names, blobs, args=encoder.objects)
        for item in [*reply["after"], *dict(reply["after_kw"]).values()]:
            decoder.decode(item)
        value = decoder.decode(reply["value"]) if kind == "return" else None
        error = _rebuilt(name, reply["error"]) if kind == "raise" else None
        return value, error, [_warning(entry) for entry in reply.get("warnings", [])[:50]]
    except Exception as exc:  # noqa: BLE001 - whatever a malformed reply breaks: WireError, KeyError, ...
        box.kill()
        raise SandboxError(f"the sandbox sent a malformed reply while running {name}: {exc}") from None


def _rebuilt(name: str, error: dict) -> BaseException:
    exc = rebuild_exception(error)
    if exc is None:
        return SandboxError(f"{name} raised {str(error.get('type'))[:100]}: {error['message'][:2000]} in the sandbox")
    exc._diloco_sandbox_where = str(error.get("where", ""))[:500]
    lines = [str(line)[:500] for line in list(error.get("traceback", []))[-12:]]
    note = "raised in the sandbox, in the graded package:\n" + "\n".join(lines)
    exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # add_note(), also on Python 3.10
    return exc


def _warning(entry: dict) -> tuple:
    category = UserWarning
    for base in entry["bases"][:20]:
        found = getattr(builtins, base, None) if type(base) is str and not base.startswith("_") else None
        if isinstance(found, type) and issubclass(found, Warning):
            category = found
            break
    lineno = entry["lineno"]
    if type(lineno) is not int or not 0 <= lineno < 1 << 31:
        raise WireError("a warning with a malformed line number")
    return str(entry["message"])[:2000], category, str(entry["filename"])[:200], lineno


def _callback(session: _Session, request: Encoder, call: tuple, header: dict, blobs: list) -> tuple[dict, list]:
    """Run the caller's callable the sandbox asked for; the answer as a frame.

    Only a callable the caller sent as one (an ``F`` item of ``request``) may be called.
    The call's arguments are brought up to date both ways around it (``after``): the
    callable sees the sandbox's Generator state and arrays, the sandbox what it changed.
    """
    objects = request.objects
    index = header.get("fn")
    if type(index) is not int or index not in request.callables:
        raise WireError(f"a callback to object {str(index)[:20]}, which is not a callable argument")
    decoder = Decoder(session.registry, session.names, blobs, args=objects)
    try:
        for item in [*header["after"], *dict(header["after_kw"]).values()]:
            decoder.decode(item)
        args = [decoder.decode(item) for item in header["args"]]
        kwargs = {str(key): decoder.decode(item) for key, item in dict(header["kwargs"]).items()}
    except Exception as exc:  # noqa: BLE001 - whatever a malformed callback breaks
        raise WireError(f"a malformed callback: {exc}") from None
    snapshots = {k: snapshot(obj) for k, obj in enumerate(objects) if isinstance(obj, np.ndarray)}
    try:
        answer = {"kind": "callback_return", "value": objects[index](*args, **kwargs)}
    except Exception as exc:  # noqa: BLE001 - raised again in the sandbox, as it would be in-process
        answer = {"kind": "callback_raise", "error": describe_exception(exc, skip=0)}
    encoder = Encoder(session.registry, session.names, lenient=True, args=objects, snapshots=snapshots)
    answer["after"] = [encoder.encode(value) for value in call[0]]
    answer["after_kw"] = {key: encoder.encode(value) for key, value in call[1].items()}
    if answer["kind"] == "callback_return":
        answer["value"] = encoder.encode(answer["value"])
    return answer, encoder.blobs


def install_for_suite(package_root=None, user: str = "nobody") -> None:
    """Run the milestone tests of this process through a sandbox of ``package_root``.

    ``tests/conftest.py`` calls it when ``$DILOCO_TEST_SANDBOX`` is set, so the whole suite
    can be run through the proxy (``DILOCO_TEST_SANDBOX=1 pytest tests``): the graded
    package is then this very ``diloco`` (the package folder above ``tools``) unless
    ``package_root`` names another.
    """
    import shutil
    import tempfile
    from pathlib import Path

    from diloco.tools.sandbox.box import prepare

    root = Path(package_root) if package_root else Path(__file__).resolve().parents[3]
    folder = Path(tempfile.mkdtemp(prefix="diloco-sandbox-"))
    atexit.register(shutil.rmtree, folder, True)
    install(prepare(root, folder, user=user))
