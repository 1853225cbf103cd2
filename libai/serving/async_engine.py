"""The engine on its own thread, for the asyncio HTTP front.

:class:`AsyncEngine` runs :meth:`LLMEngine.step` in a loop on one background thread (the
model and the scheduler are touched by that thread only). Coroutines submit requests and
cancellations through a thread-safe command queue and receive each sequence's outputs on
an ``asyncio.Queue``. A failing step does not stop the loop: the sequences of that step
get the error and are freed; the others go on. :meth:`shutdown` cancels what is left and
joins the thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass

from libai.serving.engine import LLMEngine, SequenceOutput
from libai.serving.sampling import SamplingParams
from libai.serving.scheduler import Sequence

logger = logging.getLogger(__name__)


@dataclass
class Failed:
    """Delivered instead of an output when the sequence's step raised."""

    error: BaseException


class Stream:
    """The sequences of one request and one queue of ``(index of the sequence, output or
    Failed)`` for the coroutine serving it."""

    def __init__(self, seqs: list[Sequence], loop: asyncio.AbstractEventLoop):
        self.seqs = seqs
        self.index = {seq.seq_id: i for i, seq in enumerate(seqs)}
        self.queue: asyncio.Queue = asyncio.Queue()
        self.loop = loop

    def deliver(self, seq_id: int, item) -> None:
        """From the engine thread: hand ``item`` to the coroutine serving the request."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.index[seq_id], item))


class AsyncEngine:
    """One engine thread serving many coroutines (see the module docstring)."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[int, Stream] = {}  # seq_id -> its request's stream
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="libai-engine", daemon=True)
        self._thread.start()

    async def submit(
        self, prompt_ids: list[int], params: SamplingParams, adapter: int = -1
    ) -> Stream:
        """Queue a request (through ``adapter``, -1: the base); raises
        :class:`~libai.serving.sampling.InvalidParameter` (from the engine thread's checks)
        before anything runs."""
        loop = asyncio.get_running_loop()
        reply = loop.create_future()
        self._commands.put(("add", prompt_ids, params, adapter, loop, reply))
        return await reply

    def cancel(self, stream: Stream) -> None:
        """Abort every sequence of ``stream`` (a client disconnected); their blocks are
        freed by the engine thread before its next step."""
        self._commands.put(("abort", stream))

    def shutdown(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._commands.put(("wake",))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _settle(self, future: asyncio.Future, stream: Stream | None, error) -> None:
        """On the event loop: answer a submit (a caller that already left: cancel)."""
        if future.cancelled():
            if stream is not None:
                self.cancel(stream)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(stream)

    # ---- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._drain(block=not self.engine.has_work())
            if self._stopping.is_set():
                break
            if self.engine.has_work():
                self._step()
        for stream in {id(s): s for s in self._streams.values()}.values():
            self._abort(stream, Failed(RuntimeError("the server is shutting down")))

    def _drain(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._run(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _run(self, command) -> None:
        kind = command[0]
        if kind == "add":
            _, prompt_ids, params, adapter, loop, reply = command
            try:
                seqs = self.engine.add_request(prompt_ids, params, adapter)
            except Exception as error:  # bad input: to the caller, nothing queued
                loop.call_soon_threadsafe(self._settle, reply, None, error)
                return
            stream = Stream(seqs, loop)
            for seq in seqs:
                self._streams[seq.seq_id] = stream
            loop.call_soon_threadsafe(self._settle, reply, stream, None)
        elif kind == "abort":
            self._abort(command[1], None)

    def _abort(self, stream: Stream, notice) -> None:
        for seq in stream.seqs:
            if self._streams.pop(seq.seq_id, None) is not None:
                self.engine.abort(seq)
                if notice is not None:
                    stream.deliver(seq.seq_id, notice)

    def _step(self) -> None:
        running = list(self.engine.scheduler.running) + list(self.engine.scheduler.waiting)
        try:
            outputs: list[SequenceOutput] = self.engine.step()
        except Exception as error:  # the step's sequences fail; the server goes on
            logger.exception("engine step failed")
            for seq in running:
                stream = self._streams.get(seq.seq_id)
                if stream is not None and seq.status.value == "running":
                    self._abort(stream, Failed(error))
            return
        for out in outputs:
            stream = self._streams.get(out.seq.seq_id)
            if stream is None:
                continue
            stream.deliver(out.seq.seq_id, out)
            if out.finished:
                del self._streams[out.seq.seq_id]
