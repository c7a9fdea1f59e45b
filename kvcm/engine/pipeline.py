"""The engine's step loop: the one place that decides what the host does while the GPU computes.

A step is four things:

1. *schedule*: the scheduler picks the work and reserves its pages (``Scheduler.schedule``);
2. *launch*: fill the step's buffers, run the forward or replay its graph, take the greedy choice and start
   copying it to the host, all queued on the device without waiting (``_launch``);
3. *commit*: the bookkeeping that needs only counts: the manager's end-of-step calls, a placeholder for each
   token on the way (``Scheduler.commit``);
4. *complete*: wait for the tokens, write them over the placeholders, apply the stop conditions
   (``Scheduler.complete``).

Not overlapped, each step completes before the next is scheduled, so the GPU idles while the host schedules,
fills and completes. Overlapped (the approach of SGLang's overlap scheduler and vLLM's async scheduling), step
``n + 1`` is scheduled and launched before step ``n`` completes: a decode whose input is step ``n``'s token
carries a placeholder, and the device, which has the token, swaps it in (``ModelRunner.resolve_placeholders``).
The host's work for step ``n + 1`` and its completion of step ``n`` then run while the GPU computes step
``n + 1``.

Greedy tokens are the same either way: every input token is the one the non-overlapped loop would feed. What
changes is only when the host learns that a token stopped a sequence (EOS, a stop token or string): one step
later, so that sequence runs one step too many (its token is dropped) and frees its pages a step later. A
length limit is known without the token, so it is applied at commit, as before.

A speculative step (a drafter, and no more active requests than its cut-off: ``Scheduler.decide``,
``spec_cutoff.py``) takes several logit rows per sequence; it is not overlapped: the drafter proposes after
*schedule* (``Scheduler.draft``), and *commit* and *complete* are one ``Scheduler.verify``, since how many tokens
a step keeps is known only from its tokens, and the next step's drafts are learned from them. Its host work
between reading a step's tokens and launching the next (verify, schedule, draft, fill) is therefore added to
every step (``benchmarks/spec_host.py`` measures it). A step above the cut-off is a plain step and overlaps like
one; the first speculative step after it completes the step in flight before it is scheduled.

A step in which the drafter has nothing to propose runs as a plain ``(bs, 1)`` decode (``NgramDrafter.draft``),
but still serially. Overlapping it would mean launching the step after it before its token is read, that is
before the drafter could propose for that step, so every return to drafting would drain the pipeline (a serial
step's host work each time); and with TensorRT-LLM's public n-gram pool such steps are few (any one-token pattern
seen in earlier text is a proposal: on 16 GSM8K prompts at batch 1, 12-14% of steps had none, most of them in
the first request).
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch

from . import sampler
from .scheduler import Scheduler


@dataclass
class Verification:
    """A launched speculative step: what ``Scheduler.verify`` needs once its tokens are read."""
    seqs: list
    items: list


@dataclass
class Launch:
    """One recorded launch (``StepPipeline.timeline``). ``host``: the host's clock (``time.perf_counter``) as the
    launch began, before its schedule, so one launch's ``host`` to the next one's is a step's host period. On CUDA,
    events queued right before a graph's replay (after its buffers were copied; None for an eager step) and right
    after the forward, so ``start`` to ``done`` is the step's GPU time and ``done`` to the next launch's ``done``
    its period on the GPU's clock (both None off CUDA). ``prefill_tokens``: the tokens of its prefill chunks (0 for
    a step of decodes), so a benchmark can tell the time prefill takes from the time decoding does."""
    host: float
    start: torch.cuda.Event | None
    done: torch.cuda.Event | None
    rows: int
    static: object       # the ``StaticStep`` that ran it (a decode graph or a token bucket), None when eager
    prefill_tokens: int = 0


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read yet."""
    pending: list                        # (sequence, output position) of each logit row
    packed: torch.Tensor                 # [2, k] tokens and margins, on the host once ``ready`` has fired
    ready: torch.cuda.Event | None       # CUDA: the copy to the host is done


class StepPipeline:
    def __init__(self, runner, graphs=None, *, overlap: bool):
        """``runner``: the target's ``ModelRunner``; ``graphs``: its ``StepGraphs`` when steps replay (None
        otherwise; ``close`` drops them); ``overlap``: launch each plain step before the previous one completes.
        ``timeline``: set it to a list to have each launch append a :class:`Launch` (``benchmarks/step_profile.py``
        reads each step's GPU period, and so its host share, from them; ``benchmarks/host_step.py`` the host's)."""
        self.runner, self.graphs = runner, graphs
        self.overlap = overlap
        self.cuda = runner.device.type == "cuda"
        rows = runner.last_tokens.numel()
        # two pinned host buffers for the tokens: step n + 1's copy must not overwrite step n's before it is
        # read. Flat, so a step's [2, k] view is contiguous: a copy into a strided view goes through a pageable
        # temporary, which waits for the GPU.
        self._host = [torch.zeros(2 * rows, dtype=torch.float64, pin_memory=True) for _ in range(2)] \
            if self.cuda else None
        self._turn = 0
        self.num_launched_ahead = 0      # steps launched before the previous one completed
        self.timeline: list | None = None

    @torch.inference_mode()
    def run(self, scheduler: Scheduler) -> None:
        """Step until every request has finished. The objects alive before the loop (the model, the engine)
        are left out of the garbage collector's passes while it runs (``gc.freeze``): a full pass over them
        costs a loaded process tens of milliseconds, many steps' worth of host time."""
        gc.freeze()
        try:
            self._run(scheduler)
        finally:
            gc.unfreeze()

    def _run(self, scheduler: Scheduler) -> None:
        in_flight = None
        while scheduler.has_work:
            spec = scheduler.decide()
            if spec and in_flight is not None:   # a speculative step drafts from every token: read them first
                self._complete(scheduler, in_flight)
                in_flight = None
                if not scheduler.has_work:
                    break
            step = self._launch(scheduler, spec)
            if self.overlap and not spec:   # complete the previous step while this one runs
                step, in_flight = in_flight, step
                self.num_launched_ahead += step is not None
            if step is not None:
                self._complete(scheduler, step)
        if in_flight is not None:
            self._complete(scheduler, in_flight)

    def _launch(self, scheduler: Scheduler, spec: bool = False) -> InFlight:
        began = time.perf_counter() if self.timeline is not None else 0.0
        seqs, items = scheduler.schedule()
        scheduler.draft(seqs, items)
        runner, graphs = self.runner, self.graphs
        static = graphs.pick(items) if graphs is not None else None
        timed = self.timeline is not None
        start = torch.cuda.Event(enable_timing=True) if timed and self.cuda and static is not None else None
        if static is not None:
            packed, k = graphs.launch(static, items, start)
        else:
            packed = sampler.greedy_packed(runner.run(items))
            k = packed.shape[1]
        if timed:
            self._mark(began, items, static, start)
        if self.overlap and not spec:   # only an overlapped step's successor carries placeholders for these tokens
            runner.publish(packed, k)
        if self.cuda:
            host = self._host[self._turn][:2 * k].view(2, k)
            self._turn ^= 1
            host.copy_(packed[:, :k], non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        else:
            host, ready = packed[:, :k], None
        pending = Verification(seqs, items) if spec else scheduler.commit(seqs, items)
        return InFlight(pending, host, ready)

    def _mark(self, began: float, items, static, start) -> None:
        done = None
        if self.cuda:
            done = torch.cuda.Event(enable_timing=True)
            done.record()
        prefill = sum(len(it.token_ids) for it in items if not it.decode)
        self.timeline.append(Launch(began, start, done, len(items), static, prefill))

    @staticmethod
    def _complete(scheduler: Scheduler, step: InFlight) -> None:
        if step.ready is not None:
            step.ready.synchronize()
        tokens, margins = sampler.unpack(step.packed, step.packed.shape[1])
        if isinstance(step.pending, Verification):
            scheduler.verify(step.pending.seqs, step.pending.items, tokens, margins)
        else:
            scheduler.complete(step.pending, tokens, margins)
