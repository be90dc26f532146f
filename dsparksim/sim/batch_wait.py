"""TensorRT-LLM's batch waiting (``batch_wait_timeout_iters``, ``batch_wait_max_tokens_ratio``) for one engine.

An in-flight-batching engine that admits a new prompt as soon as it can runs many steps that each carry one prefill
next to the decoding requests: every such step is slow for all of them. TensorRT-LLM can hold new context
(prefill) requests so that several prefill together. ``PyExecutor._waiting_requests`` (tensorrt_llm/_torch/
pyexecutor/py_executor.py, as stored: a 2025 version), called from ``_schedule`` only when the scheduler chose at
least one context request and one generation request (and attention DP is off):

* scheduled tokens = every chosen context request's tokens (its whole prompt, ``len(get_tokens(0))``) + one per
  generation request plus its draft tokens;
* if the wait count reached ``batch_wait_timeout_iters`` or the scheduled tokens reached
  ``batch_wait_max_tokens_ratio`` x ``max_num_tokens``: the contexts run and the count resets;
* otherwise the contexts are held this iteration and the count grows.

TensorRT-LLM's ``max_num_tokens`` bounds both a step's tokens and the contexts a step schedules (no chunking by
default); the engine here has a token budget (``max_batched_tokens``) and a prefill chunk (``prefill_chunk_tokens``),
and the smaller of the two is the rule's ``max_num_tokens``: set both to the server's value to replay it. A
context longer than a chunk is offered to the rule again before each of its chunks, counted whole (TensorRT-LLM
counts ``get_tokens(0)``), so a prompt of at least ratio x max_num_tokens never waits.

With only one of the two set the rule never holds (a count >= 0, or tokens >= 0, stops the wait at once), so
:class:`~dsparksim.config.EngineConfig` refuses one without the other. :class:`BatchWait` is that rule; the
engine's :class:`~dsparksim.sim.scheduler.Scheduler` asks it once per step that would carry both.
"""
from __future__ import annotations


class BatchWait:
    """The context-hold rule of one engine (module doc). ``held``: steps whose contexts were held."""

    def __init__(self, timeout_iters: int, max_tokens_ratio: float, max_num_tokens: int) -> None:
        if timeout_iters < 1 or not 0 < max_tokens_ratio <= 1 or max_num_tokens < 1:
            raise ValueError(f"BatchWait: expected timeout_iters >= 1, max_tokens_ratio in (0, 1] and "
                             f"max_num_tokens >= 1, got {timeout_iters}, {max_tokens_ratio}, {max_num_tokens}")
        self.timeout = int(timeout_iters)
        self.threshold = float(max_tokens_ratio) * int(max_num_tokens)   # TensorRT-LLM compares int >= float
        self.count = 0
        self.held = 0

    def hold(self, scheduled_tokens: int) -> bool:
        """Whether this step's context requests wait (updates the count). ``scheduled_tokens``: the chosen contexts'
        whole prompts plus the generation requests' 1 + draft tokens each."""
        if self.count >= self.timeout or scheduled_tokens >= self.threshold:
            self.count = 0
            return False
        self.count += 1
        self.held += 1
        return True
