"""Pre-merge and post-merge: which tests a run of a stage holds (``--kvcm-stage``, default ``pre_merge``).

TensorRT-LLM's CI runs every lane in two stages: ``pre_merge`` answers a pull request in minutes, ``post_merge``
runs the deep work after it lands (its test-db files select blocks with ``terms: {stage: pre_merge}`` or
``post_merge``). This project does the same with one marker, so that a test's stage is written next to the test:

* ``pre_merge`` (the default, so the README's plain ``pytest`` is the five-minute lane): tests marked
  ``post_merge`` are deselected, and so are tests marked ``slow`` unless asked for (``--kvcm-slow``, ``-m slow``).
* ``post_merge``: only the tests marked ``post_merge`` or ``slow`` run; the slow ones are on (the stage asks for
  them); everything else is deselected, since the pre-merge run already ran it.
* the explorer's tests (marked ``exhaustive``) run in both stages, at the quick budget pre-merge and the full
  one post-merge (``markers.exhaustive_scale``).
* any other stage (``nightly``, say): no test is deselected by its marker; the lane file's conditions decide.

Deselected rather than skipped: a test of the other stage is not a test this machine failed to run, and the
summary's count (``N deselected``) says how many there were. The stage is also what lane conditions test
(``machine.py``), so ``--kvcm-lane=l0_cpu --kvcm-stage=post_merge`` takes the post-merge block of a lane file.
"""

from __future__ import annotations

import pytest

PRE_MERGE = "pre_merge"
POST_MERGE = "post_merge"
MARKER = "post_merge"


def stage_of(config: pytest.Config) -> str:
    """The option itself, not ``machine.machine_for`` (which reads torch.cuda: seconds, and not needed here)."""
    return config.getoption("kvcm_stage", None) or PRE_MERGE


def in_stage(item: pytest.Item, stage: str, slow_asked: bool = False) -> bool:
    """Whether ``item`` belongs to a run of ``stage`` (``slow_asked``: --kvcm-slow or -m slow keeps the slow tests
    in a pre-merge run, as before stages existed)."""
    slow = item.get_closest_marker("slow") is not None
    deep = item.get_closest_marker(MARKER) is not None or slow
    if item.get_closest_marker("exhaustive") is not None and not deep:
        return True     # the explorer runs in both: its quick budget pre-merge, its full one post-merge
    if stage == PRE_MERGE:
        return item.get_closest_marker(MARKER) is None and (not slow or slow_asked)
    if stage == POST_MERGE:
        return deep
    return True


def pytest_configure(config: pytest.Config) -> None:
    stage = config.getoption("kvcm_stage", None)
    if stage is not None and not stage.strip():
        raise pytest.UsageError("--kvcm-stage='': name a stage (pre_merge, post_merge, or a lane file's own term)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from ..markers import run_slow

    stage = stage_of(config)
    slow_asked = run_slow(config)
    keep, drop = [], []
    for item in items:
        (keep if in_stage(item, stage, slow_asked) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    config.stash[_DESELECTED] = len(drop)


_DESELECTED = pytest.StashKey[int]()


def pytest_report_collectionfinish(config: pytest.Config, start_path, items) -> list[str]:
    stage = stage_of(config)
    dropped = config.stash.get(_DESELECTED, 0)
    if stage == PRE_MERGE:
        return [f"kvcm stage pre_merge: {dropped} post-merge test(s) deselected (marked post_merge or slow; "
                "--kvcm-stage=post_merge runs them)"] if dropped else []
    if stage == POST_MERGE:
        return [f"kvcm stage post_merge: the tests marked post_merge or slow; {dropped} pre-merge test(s) deselected"]
    return []
