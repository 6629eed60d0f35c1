"""``proxy.call``'s parts against a stand-in sandbox: the exchange (time-outs, interruptions)
and the reading of the reply (refusals, bad kinds, errors, warnings). No sandbox is started."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from diloco.tools.sandbox import proxy

pytestmark = pytest.mark.tooling


class Box:
    def __init__(self, reply=None, error=None, timed_out=False):
        self.reply, self.error, self.timed_out, self.killed = reply, error, timed_out, False

    def exchange(self, header, blobs, what, on_callback):
        if self.error is not None:
            raise self.error
        return self.reply, []

    def kill(self):
        self.killed = True


@pytest.fixture
def session(monkeypatch):
    state = proxy._Session({}, None)
    monkeypatch.setattr(proxy, "_session", state)
    return state


def _call(session, monkeypatch, box):
    monkeypatch.setattr(session, "sandbox", lambda: box)
    return proxy.call("model.relu", (np.zeros(2),), {})


def test_a_time_out_breaks_the_scope_and_an_interruption_kills_the_sandbox(session, monkeypatch):
    session.scope = "m05"
    box = Box(error=proxy.SandboxError("slow"), timed_out=True)
    with pytest.raises(proxy.SandboxError, match="slow"):
        _call(session, monkeypatch, box)
    assert "ran out of time" in session.broken_in["m05"] and not box.killed
    session.broken_in.clear()
    with pytest.raises(proxy.SandboxError):
        _call(session, monkeypatch, Box(error=proxy.SandboxError("died")))
    assert session.broken_in == {}, "a sandbox that died is restarted: the scope is not broken"
    box = Box(error=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _call(session, monkeypatch, box)
    assert box.killed, "a callback interrupted half-way: the sandbox is killed"


def test_a_refused_call_fails_with_the_sandbox_s_message_and_keeps_the_sandbox(session, monkeypatch):
    box = Box({"kind": "refused", "message": "no such function " + "x" * 5000})
    with pytest.raises(proxy.SandboxError) as refused:
        _call(session, monkeypatch, box)
    assert str(refused.value) == ("no such function " + "x" * 5000)[:4000] and not box.killed


def test_a_reply_of_an_unknown_kind_is_malformed_and_kills_the_sandbox(session, monkeypatch):
    box = Box({"kind": "bogus"})
    with pytest.raises(proxy.SandboxError, match="malformed reply while running model.relu: a reply of kind 'bogus'"):
        _call(session, monkeypatch, box)
    assert box.killed


def test_a_raised_error_is_raised_here_and_warnings_are_shown_here(session, monkeypatch):
    reply = {"kind": "raise", "after": [], "after_kw": {}, "error": {"bases": ["ValueError"], "message": "bad x"},
             "warnings": [{"bases": ["RuntimeWarning", "Warning"], "message": "overflow", "filename": "m.py",
                           "lineno": 3}]}
    box = Box(reply)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError, match="bad x"):
        warnings.simplefilter("always")
        _call(session, monkeypatch, box)
    assert [(w.category, str(w.message)) for w in caught] == [(RuntimeWarning, "overflow")] and not box.killed
    value = {"kind": "return", "after": [], "after_kw": {}, "value": 7, "warnings": []}
    assert _call(session, monkeypatch, Box(value)) == 7
