"""The optional prefetch thread (``prefetch`` > 0): whole plan steps generated ahead of the loop.

A :class:`PrefetchThread` belongs to one sampler; each iteration of the sampler starts its own
``run`` (a thread and a queue of planned steps), so an abandoned iterator (a
``DataLoader`` iterator replaced by a new one) stops only its own run, never the next one's.

Protocol between the training loop's thread and the prefetch thread:

* ``lock`` is held while the thread generates a step; :meth:`PlanSampler.state_dict
  <hardbatch.samplers.PlanSampler.state_dict>` takes it, so it sees the plan between steps.
* a condition variable guards the queue and the loop's progress: the loop marks the step it
  is about to hand out (:meth:`PrefetchThread.advance`) and takes planned steps
  (:meth:`PrefetchThread.take`); the thread waits while its queue holds ``depth`` steps, or
  while the sampler says a step may not be planned yet and the loop is not waiting for it.
  Lock order: ``lock``, then the condition variable.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable

import numpy as np

Step = list[np.ndarray]  # the W global batches of one step, one per rank


class _Run:
    """One iteration's prefetch thread and its queue of planned steps."""

    def __init__(self) -> None:
        self.queue: collections.deque[Step] = collections.deque()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.stop = False

    def __getstate__(self) -> dict:  # a copy never runs: keep what was planned
        return {"queue": collections.deque(self.queue), "thread": None, "error": None,
                "stop": True}


class PrefetchThread:
    """Generates up to ``depth`` steps ahead of the training loop in a thread of its own.

    Args:
        depth: the sampler's ``prefetch`` (>= 1), the most steps planned ahead.

    Example:
        >>> import numpy as np
        >>> from hardbatch.samplers.prefetch import PrefetchThread
        >>> prefetch = PrefetchThread(depth=2)
        >>> run = prefetch.start(range(3), lambda step: [np.array([step])], lambda step: True)
        >>> [prefetch.take(run)[0].tolist() for _ in range(3)]
        [[0], [1], [2]]
        >>> prefetch.stop(run)
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.run: _Run | None = None  # the newest iteration's
        self._init_sync()

    def _init_sync(self) -> None:
        self._cv = threading.Condition()
        self.lock = threading.Lock()
        self._consumer_step = -1  # global step the loop hands out next (this iteration)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_cv"] = state["lock"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_sync()

    def begin(self) -> None:
        """A new iteration supersedes the newest one: stop its thread, forget its progress."""
        self.stop(self.run)
        self.run = None
        with self._cv:
            self._consumer_step = -1

    def start(self, steps: Iterable[int], plan: Callable[[int], Step],
              ready: Callable[[int], bool]) -> _Run:
        """Plan global ``steps`` in order with ``plan(step)`` in a new thread.

        ``ready(step)`` says whether ``step`` may be planned before the loop asks for it;
        a step the loop is waiting for is always planned.
        """
        run = _Run()
        run.thread = threading.Thread(target=self._loop, args=(run, steps, plan, ready),
                                      name="hardbatch-prefetch", daemon=True)
        self.run = run
        run.thread.start()
        return run

    def _loop(self, run: _Run, steps: Iterable[int], plan: Callable[[int], Step],
              ready: Callable[[int], bool]) -> None:
        try:
            for step in steps:
                with self._cv:
                    while not run.stop and (len(run.queue) >= self.depth or not (
                            self._consumer_step >= step or ready(step))):
                        self._cv.wait(0.5)
                    if run.stop:
                        return
                with self.lock:
                    if run.stop:  # superseded while waiting for the lock: leave the plan be
                        return
                    planned = plan(step)
                    with self._cv:
                        run.queue.append(planned)
                        self._cv.notify_all()
        except BaseException as err:  # handed to the training loop by take()
            with self._cv:
                run.error = err
                self._cv.notify_all()

    def advance(self, global_step: int) -> None:
        """The loop is about to hand out ``global_step`` (called in the loop's thread)."""
        with self._cv:
            self._consumer_step = global_step
            self._cv.notify_all()

    def take(self, run: _Run) -> Step:
        """The next planned step of ``run``, waiting for it; re-raises the thread's error."""
        with self._cv:
            while not run.queue:
                if run.error is not None:
                    raise run.error
                if run.thread is None or not run.thread.is_alive():
                    raise RuntimeError("the batch prefetch thread stopped unexpectedly")
                self._cv.wait(0.5)
            planned = run.queue.popleft()
            self._cv.notify_all()
            return planned

    def planned(self) -> list[Step]:
        """The steps the newest run has planned and the loop has not taken yet."""
        with self._cv:
            return [] if self.run is None else list(self.run.queue)

    def stop(self, run: _Run | None) -> None:
        """Stop ``run``'s thread (if any) and wait for it; its queue is kept."""
        if run is None or run.thread is None:
            return
        with self._cv:
            run.stop = True
            self._cv.notify_all()
        run.thread.join()
        run.thread = None
