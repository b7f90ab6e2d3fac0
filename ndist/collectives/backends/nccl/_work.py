"""CUDA-event Work and the watchdog that completes it.

An NCCL operation is *enqueued* on a CUDA stream; the host call returns at
once. Its ``CudaWork`` holds a CUDA event recorded on that stream right after
the operation, with torch's semantics:

* ``wait()`` (no timeout) makes the *current* stream wait on the event and
  returns without blocking the host; ``wait(timeout)`` blocks the host until
  the operation finished (or raises ``DistTimeoutError``);
* ``synchronize()`` blocks the host until the event fired;
* ``is_completed()`` / ``get_future()`` reflect the GPU finishing the work.

One watchdog thread per backend polls the pending events in order, checks the
communicator for asynchronous NCCL errors, and enforces the group timeout: on
an error or a timeout it asks the backend to abort the communicator (so that
the kernels stuck waiting for a peer exit) and fails every pending Work.

What the issuing thread pays per operation is kept small: the watchdog is fed
by a lock-free ``deque.append`` of one tuple (the watchdog takes its lock once
per round, not per operation); an operation whose caller does not keep a Work
(``async_op=False``) is watched by its event alone (``Watchdog.add_event``);
events come from an ``EventPool`` and go back to it once they fired.

An operation recorded into a CUDA graph gets a ``CapturedWork``: its op runs at
each replay, so host waits on it are refused (``_capture.py``), and it is never
given to the watchdog (whose event queries must not touch a capturing stream).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

from ....runtime import DistTimeoutError, Work
from ..._capture import capture_error, wait_refusal, work_method

__all__ = ["CudaWork", "CapturedWork", "Watchdog", "unfinished", "settle_at_close", "current_stream_capturing"]

log = logging.getLogger("ndist.collectives.nccl")


class CudaWork(Work):
    """A Work completed by a CUDA event (see the module docstring).

    Like every ``Work``, its ``concurrent.futures.Future`` is made only when
    someone asks for it: enqueueing an operation and completing it from the
    watchdog cost a flag, not a Future.
    """

    __slots__ = ("_event", "_check", "_after")

    #: ``wait()`` without a timeout does not block the host (torch semantics):
    #: callers with ``async_op=False`` should call ``wait()`` without one.
    stream_ordered = True

    def __init__(self, op: str, seq: int, event: Any, check: Callable[[], BaseException | None],
                 outputs: Any = None, pending: Callable[[], str] | None = None) -> None:
        super().__init__(op, seq, outputs, pending)
        self._event = event
        self._check = check
        self._after: list | None = None  # then() steps deferred while a coalescing block is open

    # ------------------------------------------------------------ completion
    def _refuse_in_capture(self, method: str) -> None:
        """Raise ``DistCaptureError`` if ``method`` (a host wait or an event query) must not
        run now: the caller's stream is being captured and this op is still pending."""
        if not self.finished and current_stream_capturing():
            why = wait_refusal(method, captured=False, capturing=True, finished=False)
            if why is not None:
                raise capture_error(self.op, self.seq, work_method(method), why)

    def _poll(self) -> bool:
        """Complete (or fail) the work if its event fired; True once done."""
        if self.finished:
            return True
        if self._event is None or not self._event.done:  # None: its coalescing block is open
            return False
        err = self._check()
        if err is None:
            self.complete()
        else:
            self.fail(err)
        return True

    def then(self, fn: Callable[[], None], op: str | None = None) -> Work:
        """Run ``fn`` now, stream-ordered, and return a Work that also covers it.

        On CUDA a write-back (e.g. copying a staged output into a
        non-contiguous tensor) is a device copy: enqueued on the current stream
        right after the operation it is ordered after it, as torch does; it
        must not wait on the host for the operation to finish.
        """
        if self._event is None:
            # Issued inside a coalescing block: NCCL launches the op at groupEnd, so the
            # step runs then (the backend calls run_deferred) and shares the block's event.
            chained = CudaWork(op or self.op, self.seq, None, self._check, self.outputs, self.pending)
            if self._after is None:
                self._after = []
            self._after.append((fn, chained))
            return chained
        import cupy

        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - delivered to the waiter
            return Work.failed(op or self.op, err, self.seq)
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record()
        chained = CudaWork(op or self.op, self.seq, event, self._check, self.outputs, self.pending)

        def _done(work: Work) -> None:  # a done hook: on the watchdog's thread
            exc = work.error
            if exc is not None:
                chained.fail(exc)
            else:
                event.synchronize()  # only the write-back copies remain
                chained._poll()

        self.add_done_hook(_done)
        return chained

    def run_deferred(self) -> list["CudaWork"]:
        """Run the then() steps deferred by a coalescing block; return their chained works."""
        chained_works = []
        for fn, chained in self._after or ():
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                chained.fail(err)
            chained_works.append(chained)
            chained_works.extend(chained.run_deferred())
        self._after = None
        return chained_works

    # ------------------------------------------------------------- user API
    def wait(self, timeout=None) -> bool:
        if timeout is not None:
            # torch: an explicit timeout blocks the host until completion.
            self._refuse_in_capture("wait(timeout)")
            return super().wait(timeout)
        if self.error is not None:
            raise self.error
        if not self.finished:
            if self._event is None:
                raise RuntimeError(f"{self.op} (#{self.seq}): cannot wait inside the coalescing block that issued it")
            self._refuse_in_capture("wait")
            import cupy

            cupy.cuda.get_current_stream().wait_event(self._event)
        return True

    def synchronize(self) -> None:
        """Block the host until the operation finished on the GPU; raise its error."""
        self._refuse_in_capture("synchronize")
        if not self.finished:
            if self._event is None:
                raise RuntimeError(f"{self.op} (#{self.seq}): cannot wait inside the coalescing block that issued it")
            self._event.synchronize()
            self._poll()
        if self.error is not None:
            raise self.error

    def is_completed(self) -> bool:
        self._refuse_in_capture("is_completed")
        return self._poll()

    def is_success(self) -> bool:
        self._refuse_in_capture("is_success")
        return self._poll() and self.succeeded

    def exception(self) -> BaseException | None:
        self._refuse_in_capture("exception")
        self._poll()
        return self.error

    def __repr__(self) -> str:
        state = "ok" if self.succeeded else "failed" if self.finished else "pending"
        return f"<CudaWork {self.op} #{self.seq} {state}>"


def current_stream_capturing() -> bool:
    """True if CuPy's current stream is being captured into a CUDA graph.

    False where CuPy was never imported (nothing can be capturing; the CPU tests'
    host events), so the check costs a dict lookup there.
    """
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return False
    stream = cupy.cuda.get_current_stream()
    return bool(stream.ptr) and bool(stream.is_capturing())  # (the legacy stream, ptr 0, cannot capture)


class CapturedWork(Work):
    """The Work of an operation recorded into a CUDA graph while its stream was captured.

    The op runs at every replay of the graph, not now: there is nothing for the
    host to wait for, and every host wait or event query raises
    ``DistCaptureError`` (``_capture.wait_refusal``). ``wait()`` without a
    timeout, inside the capture that recorded it, orders the current stream
    after the op (an event recorded in the capture: a dependency in the graph).
    ``then(fn)`` runs ``fn`` at once, on the stream, so it is recorded too.
    """

    __slots__ = ("_event",)
    stream_ordered = True

    def __init__(self, op: str, seq: int, event: Any, outputs: Any = None) -> None:
        super().__init__(op, seq, outputs)
        self._event = event

    def _refuse(self, method: str) -> None:
        why = wait_refusal(method, captured=True, capturing=current_stream_capturing(), finished=False)
        if why is not None:
            raise capture_error(self.op, self.seq, work_method(method), why)

    def wait(self, timeout=None) -> bool:
        if timeout is not None:
            self._refuse("wait(timeout)")
        self._refuse("wait")
        import cupy

        cupy.cuda.get_current_stream().wait_event(self._event)
        return True

    def synchronize(self) -> None:
        self._refuse("synchronize")

    def is_completed(self) -> bool:
        self._refuse("is_completed")
        return False

    def is_success(self) -> bool:
        self._refuse("is_success")
        return False

    def exception(self) -> BaseException | None:
        self._refuse("exception")
        return None

    def get_future(self):
        self._refuse("get_future")

    def add_done_callback(self, fn) -> None:
        self._refuse("get_future")

    def then(self, fn: Callable[[], None], op: str | None = None) -> Work:
        import cupy

        fn()  # device copies on the capturing stream: recorded after the op
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record()
        return CapturedWork(op or self.op, self.seq, event, self.outputs)

    def __repr__(self) -> str:
        return f"<CapturedWork {self.op} #{self.seq} (recorded into a CUDA graph)>"


def unfinished(works) -> bool:
    """True if any of ``works`` may still run on the GPU.

    A Work issued inside an open coalescing block has no event yet (NCCL
    launches the block at ``groupEnd``): it counts as unfinished.
    """
    return any(not w.finished and (w._event is None or not w._event.done) for w in works)


def settle_at_close(works, busy: bool, exc: BaseException) -> None:
    """Complete or fail ``works`` when their backend closes.

    After an abort (``busy``) every pending Work fails with ``exc``; after a
    clean destroy the finished ones complete. A Work with no event (its
    coalescing block never reached ``groupEnd``) was never launched: it fails,
    and so do the ``then()`` steps it deferred to the end of the block.
    """
    for w in works:
        if w._event is None:
            w.fail(exc)
            settle_at_close([chained for _, chained in w._after or ()], busy, exc)
            w._after = None
        elif busy:
            w.fail(exc)
        else:
            w._poll()


# A watched operation, one tuple (cheaper to build than an object): its Work (None for an
# operation whose caller keeps none), its event, deadline, op and seq (for the timeout
# message), what the GPU still reads or writes (kept alive until the event fired), the
# stream the event was recorded on (the object, held: it cannot be destroyed and its address
# reused while the entry waits; None if unknown) and the pool its event goes back to (None:
# not pooled, e.g. a coalescing block's event shared by its works).
_WORK, _EVENT, _DEADLINE, _OP, _SEQ, _KEEP, _STREAM, _POOL = range(8)


def _settled(entry: tuple) -> bool:
    work = entry[_WORK]
    return work is not None and work.finished


def _fired(entry: tuple) -> bool:
    """The entry's event fired. A query CUDA refuses counts as "not yet": while another
    thread captures a CUDA graph in mode ``global`` (torch.cuda.graph's default), CUDA may
    refuse this thread's event queries; the watchdog keeps going, and the group timeout
    still holds for the entry."""
    try:
        return entry[_EVENT].done
    except Exception:  # noqa: BLE001 - e.g. cudaErrorStreamCaptureUnsupported
        log.debug("nccl watchdog: an event query failed; counted as not fired", exc_info=True)
        return False


class Watchdog:
    """Polls pending CudaWorks of one backend on a daemon thread.

    Works only need an event with ``done`` (and ``synchronize()``), so the
    loop is exercised on CPU-only machines with host-side events.

    ``check()`` returns the communicator's asynchronous error (or None);
    ``on_fatal(exc)`` aborts the communicator; afterwards every pending work
    fails with ``exc``.

    Feeding it (``add`` / ``add_event``, on the issuing thread) appends one tuple
    to a deque, without a lock, unless the thread sleeps; the watchdog takes its
    lock once per round to take the entries whose events fired, and completes
    their works and gives their events back to their pool outside it.
    """

    def __init__(self, name: str, device: Callable[[], Any], check: Callable[[], BaseException | None],
                 on_fatal: Callable[[BaseException], None], poll_s: float = 0.0005) -> None:
        self._name = name
        self._device = device  # () -> context manager making the backend's device current
        self._check = check
        self._on_fatal = on_fatal
        self._poll_s = poll_s
        #: empty rounds (each ``poll_s``) before the thread sleeps on the condition:
        #: about 10 ms after the last work completed
        self._linger_rounds = max(1, int(0.01 / poll_s)) if poll_s > 0 else 1
        self._entries: deque[tuple] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._idle = False
        self._thread: threading.Thread | None = None
        self._call: tuple[float, str, int] | None = None  # (deadline, op, seq) of the NCCL call in progress
        self.rounds = 0  # rounds that found entries (the tests read it)

    def add(self, work: CudaWork, timeout_s: float, keepalive: Any = None, stream: Any = None,
            pool: Any = None) -> None:
        """Watch ``work`` until its event fires; ``stream``: the stream it was recorded on, if
        known; ``pool``: where its event goes once it fired and the work completed."""
        self._feed((work, work._event, time.monotonic() + timeout_s, work.op, work.seq, keepalive, stream, pool))

    def add_event(self, op: str, seq: int, event: Any, timeout_s: float, keepalive: Any = None,
                  stream: Any = None, pool: Any = None) -> None:
        """Watch an operation nobody holds a Work of (``async_op=False``): its event alone.

        Its deadline and the communicator's errors are enforced as for a Work (an
        abort fails every pending Work, and later calls raise); once the event
        fired, ``keepalive`` is let go and the event goes back to ``pool``.
        """
        self._feed((None, event, time.monotonic() + timeout_s, op, seq, keepalive, stream, pool))

    def _feed(self, entry: tuple) -> None:
        if self._stopped:
            raise RuntimeError("watchdog stopped")
        self._entries.append(entry)  # deque.append is atomic; the loop only pops from the left
        if self._idle or self._thread is None:
            with self._cond:
                self._start()
                self._cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"ndist-nccl-watchdog-{self._name}", daemon=True)
            self._thread.start()

    def enter_call(self, op: str, seq: int, timeout_s: float) -> None:
        """Arm the group timeout for an NCCL call about to be made on this thread.

        The enqueue itself can block the host: NCCL >= 2.22 connects to peers
        inside the first operation that needs them, and waits there for a peer
        that never arrives. If the call has not returned (``leave_call``) by the
        deadline, the watchdog aborts the communicator, which makes the call
        return, and fails every pending Work. One call at a time per backend.
        """
        self._call = (time.monotonic() + timeout_s, op, seq)
        if self._thread is None:
            with self._cond:
                self._start()

    def leave_call(self) -> None:
        self._call = None

    def _call_expired(self) -> tuple[float, str, int] | None:
        call = self._call
        if call is not None and time.monotonic() > call[0]:
            return call
        return None

    def pending(self) -> list[CudaWork]:
        with self._cond:
            return [e[_WORK] for e in list(self._entries) if e[_WORK] is not None and not e[_WORK].finished]

    def busy(self) -> bool:
        """True if an operation may still run on the GPU (a pending Work, or an event not fired)."""
        with self._cond:
            entries = list(self._entries)
        return any(not _settled(e) and not _fired(e) for e in entries)

    def fail_all(self, exc: BaseException) -> None:
        entries = []
        with self._cond:
            while True:  # popleft one by one: a concurrent add() appends on the right
                try:
                    entries.append(self._entries.popleft())
                except IndexError:
                    break
        for e in entries:  # (their events are not pooled again: they may never fire)
            if e[_WORK] is not None:
                e[_WORK].fail(exc)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            with self._device():
                self._loop()
        except BaseException:  # noqa: BLE001 - a dead watchdog must be visible
            log.exception("nccl watchdog for %s died", self._name)

    def _take_fired(self) -> tuple[list, tuple | None]:
        """Under the lock: pop the entries from the left whose events fired (or whose works
        finished); return them and the oldest entry still pending (or None)."""
        entries = self._entries
        ready = []
        with self._cond:
            # When the newest entry's event fired, every earlier entry on its stream has too:
            # their events need no query each (a cudaEventQuery costs ~2 us with the GIL held).
            try:
                fired = entries[-1]
            except IndexError:
                return ready, None
            if fired[_STREAM] is None or _settled(fired) or not _fired(fired):
                fired = None
            while entries:
                head = entries[0]
                if not _settled(head) and not (fired is not None and head[_STREAM] is fired[_STREAM]) \
                        and not _fired(head):
                    return ready, head
                ready.append(entries.popleft())
                if head is fired:
                    fired = None  # later entries were added after the query
        return ready, None

    def _loop(self) -> None:
        quiet = 0  # rounds in a row that found nothing to watch
        while True:
            if not self._entries and not self._stopped and self._call_expired() is None:
                quiet += 1
                if quiet <= self._linger_rounds:
                    # Stay awake a while: a rank issuing ops back to back would otherwise
                    # wake this thread through the condition on every add() (a lock, a
                    # notify and a thread switch per op, measured: 23 us per 4 KiB
                    # all_reduce on an H100 against 13 us with the linger).
                    time.sleep(self._poll_s)
                    continue
                with self._cond:
                    while not self._entries and not self._stopped and self._call_expired() is None:
                        self._idle = True
                        # The timeout covers an add() that saw _idle still False just before it was
                        # set, and a call armed by enter_call() (which does not notify: it must stay
                        # cheap).
                        self._cond.wait(0.05)
                    self._idle = False
            quiet = 0
            if self._stopped:
                return
            # One communicator check per round, then take the entries whose events fired (one
            # stream completes in order; the rest waits a round) and complete them.
            err = self._check()
            head = None
            if err is None:
                self.rounds += 1
                ready, head = self._take_fired()
                for entry in ready:
                    work = entry[_WORK]
                    if work is not None:
                        work.complete()  # (ignored if it failed meanwhile)
                    pool = entry[_POOL]
                    if pool is not None:
                        pool.release(entry[_EVENT])  # fired, and its work finished: nobody looks at it again
                ready = entry = None  # (lets go of their temporaries now, not at the next round)
            if err is None and head is not None and time.monotonic() > head[_DEADLINE]:
                work = head[_WORK]
                detail = work.pending() if work is not None and work.pending is not None else ""
                err = DistTimeoutError(
                    f"nccl {head[_OP]} (#{head[_SEQ]}) on {self._name} did not complete within "
                    f"the group timeout; the NCCL communicator was aborted{'; ' + detail if detail else ''}"
                )
            call = self._call_expired() if err is None else None
            if call is not None:
                self._call = None  # fires once
                err = DistTimeoutError(
                    f"nccl {call[1]} (#{call[2]}) on {self._name} did not return within the group timeout: the "
                    f"call blocked on the host (NCCL connects to peers inside the first operation that needs "
                    f"them, and waits for a peer that does not join); the NCCL communicator was aborted"
                )
            if err is not None:
                log.error("nccl %s: %s", self._name, err)
                try:
                    self._on_fatal(err)
                finally:
                    self.fail_all(err)
                continue
            if head is not None:
                time.sleep(self._poll_s)
