"""A benchmark run's speculative config -> the policy, block size, acceptance and drafter that simulate it.

What the engines do with the configs the benchmarks record (all verify every drafted token, no trimming, so the
policy is ``fixed:K``):

* SGLang ``--speculative-algorithm EAGLE`` (or ``NEXTN``) on DeepSeek-V3/R1 runs the model's own MTP module as
  the EAGLE draft head, ``num_steps`` times in a chain. With ``--speculative-eagle-topk 1`` SGLang forces
  ``num_draft_tokens = num_steps + 1`` (server_args.py): the target verifies each request's last accepted token
  plus ``num_steps`` drafts. So K = num_steps, and the accept length SGLang logs (accepted drafts + 1, at most
  num_steps + 1) is dsparksim's tau. InferenceX's MTP rows: num_steps 2, num_draft_tokens 3, topk 1 -> K = 2.
* ``mtp`` (TensorRT-LLM MTP, vLLM ``deepseek_mtp``): K = ``num_nextn_predict_layers`` / ``num_speculative_tokens``
  draft tokens, the one MTP module reused per position when the model has fewer modules (DeepSeek-V3/R1: 1).
* ``none`` (or empty): plain decoding, policy ``none``.

Top-k > 1 (tree drafting: several candidates per position, a tree verified with a custom mask) has no model
here and is refused, as is any other method (ngram, separate draft models): one line naming the field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from dsparksim.acceptance.mtp import K_MAX_MTP as K_MAX   # the mtp acceptance kind's bound
from dsparksim.errors import ConfigError

NO_SPEC = ("", "none", "off")
EAGLE_CHAIN = ("eagle", "nextn")      # SGLang's EAGLE worker running the MTP head (NEXTN is its alias)
MTP = ("mtp", "deepseek_mtp")


@dataclass(frozen=True)
class SpecMapping:
    """How to simulate one speculative config. ``run_options()`` gives the RunConfig options to set.

    policy:     "none" or "fixed:K";  block_size: K (None for none);
    acceptance: acceptance spec ("mtp") or None;  drafter: profile drafter ("mtp") or None;
    note:       how the config was read (what was inferred).
    """

    policy: str
    block_size: int | None
    acceptance: str | None
    drafter: str | None
    note: str

    def run_options(self) -> dict[str, Any]:
        """Options for :meth:`dsparksim.config.RunConfig.from_options` (only those this mapping sets)."""
        out: dict[str, Any] = {"policy": self.policy}
        if self.block_size is not None:
            out.update(block_size=self.block_size, acceptance=self.acceptance, drafter=self.drafter)
        return out


def _int(source: str, field: str, v: Any) -> int | None:
    """An optional positive integer field: None / "" / NaN are absent; anything else must be an integer >= 1."""
    if v is None or (isinstance(v, str) and not v.strip()) or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, bool):
        raise ConfigError(source, field, f"expected a positive integer, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(source, field, f"expected a positive integer, got {v!r}") from None
    if not f.is_integer() or f < 1:
        raise ConfigError(source, field, f"expected a positive integer, got {v!r}")
    return int(f)


def map_spec(spec_method: Any, num_steps: Any = None, num_draft_tokens: Any = None, topk: Any = None,
             mtp_nextn: Any = None, *, source: str = "speculative config") -> SpecMapping:
    """Map a run's speculative fields (column names of the runs table: spec_method, spec_num_steps,
    spec_num_draft_tokens, spec_topk, spec_mtp_nextn) to a :class:`SpecMapping`. ConfigError naming the field for
    a config the simulator cannot model."""
    method = "" if spec_method is None or (isinstance(spec_method, float) and math.isnan(spec_method)) \
        else str(spec_method).strip().lower()
    steps = _int(source, "spec_num_steps", num_steps)
    ndt = _int(source, "spec_num_draft_tokens", num_draft_tokens)
    k = _int(source, "spec_topk", topk)
    nextn = _int(source, "spec_mtp_nextn", mtp_nextn)
    if method in NO_SPEC:
        given = [n for n, v in (("spec_num_steps", steps), ("spec_num_draft_tokens", ndt), ("spec_topk", k),
                                ("spec_mtp_nextn", nextn)) if v is not None]
        if given:
            raise ConfigError(source, given[0], f"set while spec_method is {method or 'empty'!r} (no speculation); "
                              "give the method or clear the field")
        return SpecMapping("none", None, None, None, "no speculative decoding: plain decoding (policy none)")
    if method not in EAGLE_CHAIN + MTP:
        raise ConfigError(source, "spec_method", f"unsupported speculative method {method!r}; the simulator models "
                          f"the MTP-head chain ({', '.join(EAGLE_CHAIN + MTP)}) and none")
    if k is not None and k > 1:
        raise ConfigError(source, "spec_topk", f"topk {k} is tree drafting (several candidates per position), "
                          "which the simulator does not model; only topk 1 (a chain) maps to a policy")
    notes = []
    if method in EAGLE_CHAIN:
        if nextn is not None and steps is not None and nextn != steps:
            raise ConfigError(source, "spec_mtp_nextn", f"{nextn} disagrees with spec_num_steps {steps}: EAGLE "
                              "drafts num_steps tokens with the MTP module")
        if steps is None:
            raise ConfigError(source, "spec_num_steps", f"missing: {method} drafts num_steps tokens per step "
                              "(--speculative-num-steps); the block size cannot be inferred without it")
        if ndt is not None and ndt != steps + 1 and k == 1:
            notes.append(f"num_draft_tokens {ndt} with topk 1: SGLang adjusts it to num_steps + 1 = {steps + 1}")
        elif ndt is not None and ndt != steps + 1:
            raise ConfigError(source, "spec_num_draft_tokens", f"{ndt} with spec_num_steps {steps}: a topk-1 chain "
                              f"verifies num_steps + 1 = {steps + 1} tokens; without spec_topk 1 another value "
                              "suggests a tree, which the simulator does not model")
        if k is None:
            notes.append("topk not recorded: a chain (topk 1) assumed"
                         + (f", consistent with num_draft_tokens {ndt} = num_steps + 1" if ndt else ""))
        K = steps
        notes.insert(0, f"{method}: MTP module chained num_steps = {K} times, {K + 1} tokens verified per request "
                        "per step (K drafts + the anchor)")
    else:
        if steps is not None and nextn is not None and steps != nextn:
            raise ConfigError(source, "spec_num_steps", f"{steps} disagrees with spec_mtp_nextn {nextn}")
        K = nextn if nextn is not None else steps
        if K is None:
            raise ConfigError(source, "spec_mtp_nextn", "missing: mtp drafts num_nextn_predict_layers tokens per "
                              "step; give spec_mtp_nextn (or spec_num_steps)")
        if ndt is not None and ndt not in (K, K + 1):
            raise ConfigError(source, "spec_num_draft_tokens", f"{ndt} with {K} MTP draft positions: expected {K} "
                              f"(drafts) or {K + 1} (drafts + anchor)")
        notes.append(f"mtp: {K} draft tokens per step from the MTP module reused per position")
    if K > K_MAX:
        raise ConfigError(source, "spec_num_steps" if method in EAGLE_CHAIN or nextn is None else "spec_mtp_nextn",
                          f"{K} draft positions; the mtp acceptance covers 1..{K_MAX}")
    return SpecMapping(f"fixed:{K}", K, "mtp", "mtp", "; ".join(notes) + f"; every draft verified (fixed:{K})")


def map_row(row: Mapping[str, Any], *, source: str = "runs table") -> SpecMapping:
    """:func:`map_spec` on a runs-table row (a dict or pandas Series keyed by the column names)."""
    return map_spec(row.get("spec_method"), row.get("spec_num_steps"), row.get("spec_num_draft_tokens"),
                    row.get("spec_topk"), row.get("spec_mtp_nextn"), source=source)
