"""A violation's sequence as a plain test: the manager calls it made, written out, then the check that failed.

The operations are replayed on a fresh manager through a proxy that records every call, so the test holds the
calls themselves (``mgr.begin_context_chunk('r0', 0, 3, 3)``), not the explorer's alphabet: it keeps failing the
same way if the explorer changes, and reads as what an engine did.
"""

from __future__ import annotations

from .configs import Config, build
from .ops import Driver, Refused, apply


class _Recorder:
    def __init__(self, mgr):
        self._mgr = mgr
        self.calls: list[str] = []

    def __getattr__(self, name):
        target = getattr(self._mgr, name)
        if not callable(target) or name.startswith("get_") or name in ("has_request", "block_table", "is_loading"):
            return target

        def call(*args, **kwargs):
            text = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
            self.calls.append(f"mgr.{name}({text})")
            return target(*args, **kwargs)

        return call


def recorded_calls(cfg: Config, ops: list) -> list[list[str]]:
    """The manager calls of each operation, replayed on a fresh manager (the last may raise: it is recorded)."""
    rec, prompts = _Recorder(build(cfg)), cfg.prompts()
    drv, out = Driver((None,) * cfg.slots, None), []
    for op in ops:
        start = len(rec.calls)
        try:
            drv = apply(rec, cfg, prompts, drv, op)
        except Refused:
            pass
        except Exception:  # noqa: BLE001 - the last operation's failure is the finding
            pass
        out.append(rec.calls[start:])
    return out


_CHECK = {
    "raised": "    {last}                # raised: only documented exceptions may escape",
    "refused-changed": "    before = observe(mgr)\n    with pytest.raises(OutOfPagesError):\n        {last}\n"
                       "    assert observe(mgr) == before",
    "clock-changed": "    before = observe(mgr)\n    try:\n        {last8}\n    except UserCallbackError:\n"
                     "        pass\n    assert observe(mgr) == before",
    "rule-changed": "    before = observe(mgr)\n    SWITCH.left = {k}            # failing_rules.SWITCH: the {k}-th rule the call runs raises\n"
                    "    try:\n        {last8}\n    except UserCallbackError:\n        pass\n    SWITCH.left = 0\n"
                    "    assert observe(mgr) == before",
    "build": "    # building it raised: {message}",
    "books": "    {last}\n    check_books(mgr)",
    "free-all": "    {last}\n    all_free_after_reset(mgr)",
    "query": "    {last}                # then a query: {message}",
    "oracle": "    {last}                # the oracle: {message}",
    "events": "    {last}\n    router(mgr)          # {message}",
}


def _fails_at(op: tuple) -> int:
    """K of a ``rule-raises@K?`` operation (0 for any other)."""
    return int(op[0][len("rule-raises@"):-1]) if op and op[0].startswith("rule-raises@") else 0


def replay_text(cfg: Config, violation) -> str:
    calls = recorded_calls(cfg, violation.ops) if violation.ops else []     # a ``build`` failure has no calls
    body = [c for op_calls in calls[:-1] for c in op_calls]
    last = calls[-1] if calls else []
    check = _CHECK[violation.kind].format(last="\n    ".join(last) or "pass", last8="\n        ".join(last) or "pass",
                                          message=violation.message, k=_fails_at(violation.ops[-1] if violation.ops else ()))
    head = [f"def test_{cfg.name.replace('-', '_').replace('+', '_')}_{violation.kind.replace('-', '_')}():",
            f"    mgr = build({cfg!r})"]
    if violation.kind == "events":       # a router's index fed the events after every call (_observe.RouterIndex)
        head.append("    router = RouterIndex(mgr)")
        body = [line for op_calls in calls[:-1] for line in op_calls + ["router(mgr)"]]
    lines = head + [f"    {c}" for c in body] + [check]
    return "\n".join(lines)
