"""TensorRT-LLM's attention-DP context balance (``attention_dp_config: enable_balance``) for a replica's lockstep DP
ranks.

With attention data parallelism every rank prefills its own new requests, and a lockstep step lasts as long as its
slowest rank: a rank that prefills alone stalls the other ranks' decoding for the whole prefill. TensorRT-LLM
therefore holds context (prefill) requests until every rank has one, so that the ranks prefill together and pay one
stall. ``PyExecutor._balance_adp_requests`` (tensorrt_llm/_torch/pyexecutor; later versions moved it into the
scheduler, logic unchanged), once per iteration over the ranks' scheduled requests:

* every rank has a free slot (generation requests < max batch size) and a context request: the timeout count
  resets; if every rank also has generation requests, contexts are held for ``batching_wait_iters`` more
  iterations (a batching count), then run;
* otherwise the timeout count grows and contexts are held, unless it reached ``timeout_iters`` or some rank has no
  generation request (nothing to stall): then the count resets and they run.

:class:`DPBalance` is that rule, applied by the replica's :class:`~dsparksim.sim.driver.Driver` to all of its ranks
at once (the decision is global, as the executor's all-gather makes it). A rank's "context requests" are its
running requests with prompt tokens left to prefill; while held, a step carries their ranks' decoding only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:   # annotations only
    from dsparksim.sim.scheduler import Scheduler


class DPBalance:
    """The context-hold rule of one replica's DP ranks (module doc). ``held``: iterations with contexts held."""

    def __init__(self, timeout_iters: int, batching_wait_iters: int = 0) -> None:
        if timeout_iters < 0 or batching_wait_iters < 0:
            raise ValueError(f"DPBalance: iteration counts must be >= 0, got timeout_iters {timeout_iters}, "
                             f"batching_wait_iters {batching_wait_iters}")
        self.timeout, self.batching_wait = int(timeout_iters), int(batching_wait_iters)
        self.waiting = 0     # iterations since every rank last had a context request (the timeout count)
        self.batching = 0    # iterations held with every rank ready (the batching count)
        self.held = 0

    def hold(self, ranks: Sequence["Scheduler"]) -> bool:
        """Whether this iteration's context requests are held on every rank (updates the counts)."""
        counts = [eng.phase_counts() for eng in ranks]        # (decoding, prefilling) per rank
        all_ctx = all(n_pf > 0 and n_dec < eng.max_seqs for (n_dec, n_pf), eng in zip(counts, ranks))
        all_gen = all(n_dec > 0 for n_dec, _ in counts)
        if all_ctx:
            self.waiting = 0
            if all_gen:
                if self.batching < self.batching_wait:
                    self.batching += 1
                    return self._held()
                self.batching = 0
            return False
        self.waiting += 1
        if self.waiting >= self.timeout or not all_gen:
            self.waiting = 0
            return False
        return self._held()

    def _held(self) -> bool:
        self.held += 1
        return True
