"""How a replica's requests become ``predict`` calls. Standard library only, like all of ``kiln.injob``.

Without batching (``max_batch_size`` 1) each request is one call on its own instances. With batching, one thread
collects the instances of concurrent requests into one call of up to ``max_batch_size`` instances, waiting at most
``max_latency_ms`` after the first for more, and hands each request its slice of the outputs; a request larger
than ``max_batch_size`` runs alone, in chunks of that size. Requests are batched together only when they carry the
same ``parameters`` (a custom predictor may read them; the built-ins ignore them).

The predictor is called by one thread at a time: a custom predictor need not be thread-safe, and a framework
already spreads one call over the CPUs it was given.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

PredictFn = Callable[[list[Any], dict[str, Any]], list[Any]]


class _Pending:
    """One request waiting for its batch."""

    __slots__ = ("arrived", "batch_size", "done", "error", "inputs", "key", "outputs", "parameters")

    def __init__(self, inputs: list[Any], parameters: dict[str, Any], key: str) -> None:
        self.inputs = inputs
        self.parameters = parameters
        self.key = key
        self.arrived = time.monotonic()
        self.done = threading.Event()
        self.outputs: list[Any] = []
        self.error: BaseException | None = None
        self.batch_size = 0


class Batcher:
    """``run(inputs, parameters)`` → (outputs, the size of the batch they ran in); raises what predict raised."""

    def __init__(
        self, predict: PredictFn, max_batch_size: int, max_latency_ms: float, keyed_by_parameters: bool
    ) -> None:
        self.predict = predict
        self.max_batch_size = max(1, max_batch_size)
        self.max_latency = max(0.0, max_latency_ms) / 1000.0
        self.keyed = keyed_by_parameters
        self.lock = threading.Lock()  # one predict call at a time
        self.cond = threading.Condition()  # guards queue and stopping
        self.queue: deque[_Pending] = deque()
        self.stopping = False
        self.thread: threading.Thread | None = None

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 1

    def start(self) -> None:
        if self.batching:
            self.thread = threading.Thread(target=self._loop, name="kiln-batcher", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """Run what is queued, then end the batching thread."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join()

    def run(self, inputs: list[Any], parameters: dict[str, Any]) -> tuple[list[Any], int]:
        if not self.batching:
            return self._call(inputs, parameters), len(inputs)
        size = self.max_batch_size
        if len(inputs) > size:  # its own batches, in order
            outputs: list[Any] = []
            for start in range(0, len(inputs), size):
                outputs.extend(self._call(inputs[start : start + size], parameters))
            return outputs, size
        key = json.dumps(parameters, sort_keys=True, default=str) if self.keyed else ""
        pending = _Pending(inputs, parameters, key)
        with self.cond:
            if self.stopping:
                raise RuntimeError("the replica is stopping")
            self.queue.append(pending)
            self.cond.notify_all()
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.outputs, pending.batch_size

    def _call(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        with self.lock:
            return self.predict(inputs, parameters)

    def _loop(self) -> None:
        while True:
            batch = self._collect()
            if batch is None:
                return
            self._run(batch)

    def _collect(self) -> list[_Pending] | None:
        """The next batch: the oldest request and the ones after it with the same parameters that fit, waiting
        for more until ``max_latency`` after the oldest arrived; None once stopping with nothing queued."""
        with self.cond:
            while not self.queue:
                if self.stopping:
                    return None
                self.cond.wait()
            first = self.queue.popleft()
            batch, count = [first], len(first.inputs)
            deadline = first.arrived + self.max_latency
            while count < self.max_batch_size:
                same = next((p for p in self.queue if p.key == first.key), None)
                if same is not None:
                    if count + len(same.inputs) > self.max_batch_size:
                        break
                    self.queue.remove(same)
                    batch.append(same)
                    count += len(same.inputs)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.stopping:
                    break
                self.cond.wait(remaining)
            return batch

    def _run(self, batch: list[_Pending]) -> None:
        inputs = [instance for pending in batch for instance in pending.inputs]
        try:
            outputs = self._call(inputs, batch[0].parameters)
            if len(outputs) != len(inputs):  # the predictors check this; a guard for the slicing below
                raise ValueError(f"predict returned {len(outputs)} outputs for {len(inputs)} inputs")
        except BaseException as exc:  # every waiting request gets the error, the thread goes on
            for pending in batch:
                pending.error = exc
                pending.done.set()
            return
        start = 0
        for pending in batch:
            pending.outputs = outputs[start : start + len(pending.inputs)]
            pending.batch_size = len(inputs)
            start += len(pending.inputs)
            pending.done.set()
