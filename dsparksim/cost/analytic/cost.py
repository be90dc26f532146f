"""Per-forward analytic cost terms: one forward of M query tokens on one GPU of one engine (DP rank).

Every term is a kernel priced with the fitted efficiency curves (:mod:`dsparksim.cost.analytic.efficiency`) or a stated
communication/launch model whose figures are cited in :data:`ASSUMPTIONS`. Context-dependent attention work is
NOT in :meth:`ForwardModel.terms` (it is the profile's linear ``attention`` term and ``prefill`` query-key term:
:meth:`ForwardModel.seconds_per_kv_token`, :meth:`ForwardModel.seconds_per_query_key`).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsparksim.cost.analytic.arch import Arch
from dsparksim.cost.analytic.efficiency import Efficiency, elementwise_time, gemm_time
from dsparksim.cost.analytic.hardware import GPU
from dsparksim.errors import InputError

__all__ = ["Parallel", "ForwardModel", "ASSUMPTIONS", "DTYPE_BYTES", "expected_distinct_experts",
           "allreduce_time", "alltoall_time"]

DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}

# Every figure that is not fitted: value + where it comes from. Written into each built profile's metadata.
ASSUMPTIONS: dict[str, dict[str, Any]] = {
    "allreduce_latency_s": {"value": 10e-6, "source": "assumption (same as profiles/derive_vidur.py for H100): "
                                                      "NCCL small-message all-reduce latency within one NVLink node"},
    "allreduce_busbw_frac": {"value": 0.8, "source": "assumption: NCCL ring bus bandwidth as a fraction of the "
                                                     "per-direction NVLink datasheet figure (nvlink_gb_s_per_gpu / 2)"},
    "alltoall_latency_s": {"value": 10e-6, "source": "assumption: per dispatch or combine call within one node"},
    "alltoall_bw_frac": {"value": 153 / 200, "source": "DeepEP README (deepseek-ai/DeepEP): intranode EP8 normal "
                         "kernels reach 153 GB/s dispatch / 158 GB/s combine on H800, whose NVLink is 400 GB/s "
                         "both directions (200 per direction): 153/200 of the per-direction datasheet figure"},
    "alltoall_dispatch_bytes": {"value": 1.0, "source": "DeepEP: FP8 dispatching, BF16 combining (bytes/element)"},
    "moe_topk_s": {"value": 2e-6, "source": "one small kernel launch: vllm-project/vllm PR #43250 measures ~2 us "
                                            "per MoE reduction kernel launch at decode sizes"},
    "moe_align_permute_s": {"value": 20.6e-6, "source": "sgl-project/sglang PR #7794 benchmark: moe_align_block_size "
                            "~20.5-20.9 us at 1-16 tokens for 128/256 experts, top-1..8 (SGL kernel); vLLM PR "
                            "#55225 reports ~20-27 us per dispatch on H100"},
    "moe_unpermute_s": {"value": 2e-6, "source": "one reduction kernel launch (vllm PR #43250, ~2 us)"},
    "moe_block_m": {"value": 64, "source": "Triton fused-MoE default BLOCK_SIZE_M = 64 (vllm PR #55225): each "
                    "active expert computes at least a 64-row tile, so work grows with active experts"},
    "attention_launch": {"value": "t0_gemm_s", "source": "assumption: one attention kernel per layer costs one "
                                                         "fitted GEMM launch floor besides its KV reads"},
    "efficiency_dtype": {"value": "fp16 fit", "source": "assumption: the fp16-fitted fractions apply to bf16 and "
                                                        "fp8 (fp8 uses the fp8 dense peak)"},
    "sampling_bytes_per_logit": {"value": 8.0, "source": "assumption: fp32 logits written and read once by "
                                                         "softmax/sampling"},
}


def A(key: str) -> Any:
    return ASSUMPTIONS[key]["value"]


# per-call latencies of the forward: with the efficiency fit's per-kernel floors (t0_gemm_s, t0_ew_s) they make up
# the ``floor`` cost family (:meth:`ForwardModel.floorless`)
LATENCY_KEYS = ("allreduce_latency_s", "alltoall_latency_s", "moe_topk_s", "moe_align_permute_s", "moe_unpermute_s")


def expected_distinct_experts(E: int, k: int, tokens: Any) -> Any:
    """Expected number of distinct experts hit by `tokens` tokens each routed to k of E (uniform, independent)."""
    return E * (1.0 - (1.0 - k / E) ** np.asarray(tokens, dtype=float))


def allreduce_time(nbytes: Any, n: int, busbw_Bps: float, latency_s: float) -> Any:
    """Ring all-reduce over n GPUs: latency + 2(n-1)/n * bytes / bus bandwidth (0 for n == 1)."""
    nbytes = np.asarray(nbytes, dtype=float)
    if n <= 1:
        return np.zeros_like(nbytes)
    return latency_s + 2.0 * (n - 1) / n * nbytes / busbw_Bps


def alltoall_time(nbytes_per_rank: Any, n: int, bw_Bps: float, latency_s: float) -> Any:
    """All-to-all over n GPUs: latency + the (n-1)/n of each rank's bytes that leave it / link bandwidth."""
    nbytes = np.asarray(nbytes_per_rank, dtype=float)
    if n <= 1:
        return np.zeros_like(nbytes)
    return latency_s + (n - 1) / n * nbytes / bw_Bps


@dataclass(frozen=True)
class Parallel:
    """tp GPUs per engine (DP rank), dp engines, experts spread over ep GPUs (ep divides tp*dp)."""

    tp: int = 1
    ep: int = 1
    dp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def expert_tp(self) -> int:
        """GPUs sharing one expert's weights by tensor parallelism (all GPUs of an EP group of size ep)."""
        return self.gpus // self.ep if self.ep > 1 else self.tp


class ForwardModel:
    """Seconds of one forward over M tokens on one GPU, split into named terms (arrays over M)."""

    def __init__(self, arch: Arch, gpu: GPU, par: Parallel, eff: Efficiency, dtype: str = "bf16",
                 kv_dtype: str | None = None):
        self.a, self.g, self.p, self.eff, self.dtype = arch, gpu, par, eff, dtype
        self.kv_dtype = kv_dtype or ("bf16" if dtype == "fp8" else dtype)
        self.wb, self.kvb = DTYPE_BYTES[dtype], DTYPE_BYTES[self.kv_dtype]
        self.bw, self.fl = gpu.hbm_Bps, gpu.peak_flops(dtype)
        self.fl16 = gpu.peak_flops("bf16")
        half_nvl = gpu.nvlink_Bps / 2
        self.ar_bw, self.a2a_bw = half_nvl * A("allreduce_busbw_frac"), half_nvl * A("alltoall_bw_frac")
        self._floors = True

    def _lat(self, key: str) -> float:
        """A per-call latency assumption (0 in the :meth:`floorless` model)."""
        return float(A(key)) if self._floors else 0.0

    def floorless(self) -> "ForwardModel":
        """The same model without its M-independent floors: no per-kernel launch floor (the efficiency fit's
        ``t0_gemm_s`` and ``t0_ew_s``) and no per-call latency (:data:`LATENCY_KEYS`: collectives, MoE
        top-k/align/unpermute kernels). ``terms() - floorless().terms()`` is therefore a constant over M per
        term: the ``floor`` cost family of :mod:`dsparksim.cost.analytic.calibration`."""

        fm = copy.copy(self)
        fm.eff = dataclasses.replace(self.eff, t0_gemm_s=0.0, t0_ew_s=0.0)
        fm._floors = False
        return fm

    # ------------------------------------------------------------------ kernels
    def _g(self, M: Any, K: float, N: float, w: float | None = None) -> Any:
        fl = self.fl if (w or self.wb) == 1.0 else self.fl16
        return gemm_time(self.eff, M, K, N, self.bw, fl, w_bytes=w or self.wb)

    def _ew(self, nbytes: Any) -> Any:
        return elementwise_time(self.eff, nbytes, self.bw)

    def _ar(self, M: Any) -> Any:
        return allreduce_time(np.asarray(M, float) * self.a.hidden * 2.0, self.p.tp, self.ar_bw,
                              self._lat("allreduce_latency_s"))

    # ------------------------------------------------------------------ shapes
    @property
    def kv_heads_per_gpu(self) -> float:
        return max(self.a.n_kv_heads / self.p.tp, 1.0)   # KV heads are replicated when tp > n_kv_heads

    def attn_proj(self, M: Any) -> Any:
        """Attention projections of one layer (GQA: qkv + o; MLA: q_a, q_b, kv_a, absorbed kv_b, o + 2 norms)."""
        a, tp = self.a, self.p.tp
        nh = a.n_heads / tp
        if not a.is_mla:
            qkv = (nh + 2 * self.kv_heads_per_gpu) * a.head_dim
            return self._g(M, a.hidden, qkv) + self._g(M, nh * a.head_dim, a.hidden)
        Mf = np.asarray(M, float)
        t = self._g(M, a.hidden, a.kv_lora_rank + a.qk_rope_head_dim)             # kv_a: replicated
        if a.q_lora_rank:
            t = t + self._g(M, a.hidden, a.q_lora_rank) + self._g(M, a.q_lora_rank, nh * a.head_dim)
            t = t + self._ew(2 * Mf * a.q_lora_rank * 2)                            # q_a_layernorm
        else:
            t = t + self._g(M, a.hidden, nh * a.head_dim)
        t = t + self._ew(2 * Mf * a.kv_lora_rank * 2)                               # kv_a_layernorm
        # weight absorption (decode): W_UK and W_UV are still read once per forward
        t = t + self._g(M, a.kv_lora_rank, nh * (a.qk_nope_head_dim + a.v_head_dim))
        return t + self._g(M, nh * a.v_head_dim, a.hidden)

    def layer_common(self, M: Any) -> Any:
        """Norms, rope, residual add and the attention kernel launch of one layer (not MLP/MoE, not comm)."""
        a = self.a
        Mf = np.asarray(M, float)
        rope = 2 * Mf * (a.n_heads / self.p.tp + self.kv_heads_per_gpu) * (a.qk_rope_head_dim or a.head_dim) * 2
        ew = self._ew(2 * Mf * a.hidden * 2) * 2 + self._ew(rope) + self._ew(3 * Mf * a.hidden * 2)
        return ew + self.eff.t0_gemm_s

    def dense_mlp(self, M: Any, ffn: int | None = None) -> Any:
        f = (ffn or self.a.ffn) / self.p.tp
        Mf = np.asarray(M, float)
        return self._g(M, self.a.hidden, 2 * f) + self._ew(1.5 * Mf * 2 * f * 2) + self._g(M, f, self.a.hidden)

    def moe(self, M: Any) -> dict[str, Any]:
        """One MoE layer's terms: router, fixed (top-k, align/permute, unpermute), shared, routed, all-to-all."""
        a, p = self.a, self.p
        Mf = np.asarray(M, float)
        Mg = Mf * (p.dp if p.ep > 1 else 1)          # tokens routed together: the whole EP group (lockstep ranks)
        touched = expected_distinct_experts(a.n_experts, a.top_k, Mg) / p.ep
        assign = Mg * a.top_k / p.ep                  # token-expert pairs computed on this GPU
        f = a.moe_ffn / p.expert_tp
        per_expert = assign / touched
        bm = A("moe_block_m")
        rows = touched * bm * np.ceil(per_expert / bm)        # every active expert computes whole 64-row tiles
        w_bytes = touched * 3 * a.hidden * f * self.wb
        nbytes = w_bytes + assign * (a.hidden * 3 + 2 * f) * 2.0
        flops = 2.0 * rows * 3 * a.hidden * f
        e = self.eff
        routed = 2 * e.t0_gemm_s + np.maximum(nbytes / (self.bw * e.e_bw(nbytes)),
                                              flops / (self.fl * e.e_fl(rows / touched)))
        routed = routed + self._ew(1.5 * assign * 2 * f * 2)
        out = {"moe_router": self._g(M, a.hidden, a.n_experts, w=2.0),
               "moe_fixed": np.full_like(Mf, self._lat("moe_topk_s") + self._lat("moe_align_permute_s")
                                         + self._lat("moe_unpermute_s")),
               "moe_routed": routed,
               "moe_shared": (self.dense_mlp(M, a.n_shared_experts * a.moe_ffn) if a.n_shared_experts
                              else np.zeros_like(Mf)),
               "ep_alltoall": np.zeros_like(Mf)}
        if p.ep > 1 and p.dp > 1:
            # DP ranks hold different tokens: dispatch to and combine from the experts' ranks. With dp == 1 every
            # rank already holds all M tokens (TP attention) and the TP all-reduce after the layer combines them.
            lat = self._lat("alltoall_latency_s")
            disp = Mf * a.top_k * a.hidden * A("alltoall_dispatch_bytes")
            comb = Mf * a.top_k * a.hidden * 2.0
            out["ep_alltoall"] = (alltoall_time(disp, p.ep, self.a2a_bw, lat)
                                  + alltoall_time(comb, p.ep, self.a2a_bw, lat))
        out["moe_active_experts_per_gpu"] = touched
        return out

    def head(self, M: Any) -> dict[str, Any]:
        a, tp = self.a, self.p.tp
        Mf = np.asarray(M, float)
        gather = self.vocab_gather(M)
        return {"embedding": self._ew(2 * Mf * a.hidden * 2),
                "lm_head": self._g(M, a.hidden, a.vocab / tp, w=2.0) + self._ew(2 * Mf * a.hidden * 2) + gather,
                "sampling": self._ew(Mf * a.vocab * A("sampling_bytes_per_logit"))}

    def vocab_gather(self, M: Any) -> Any:
        """The LM head's gather of the vocabulary shards over TP (inside the ``lm_head`` term)."""
        a, tp = self.a, self.p.tp
        Mf = np.asarray(M, float)
        return (np.zeros_like(Mf) if tp == 1 else
                self._lat("allreduce_latency_s") + (tp - 1) / tp * Mf * a.vocab * 2.0 / self.ar_bw)

    def mtp_projection(self, M: Any) -> Any:
        """What DeepSeek's MTP module adds before its transformer block: RMSNorm of the token embedding (enorm)
        and of the previous hidden state (hnorm), then eh_proj (2*hidden -> hidden), a plain replicated bf16
        linear in SGLang's DeepseekModelNextN (every TP rank reads all its weights)."""
        a = self.a
        Mf = np.asarray(M, float)
        return 2 * self._ew(2 * Mf * a.hidden * 2) + self._g(M, 2 * a.hidden, a.hidden, w=2.0)

    # ------------------------------------------------------------------ whole forward
    def terms(self, M: Any, n_layers: int | None = None, n_moe_layers: int | None = None,
              dense_ffn: int | None = None) -> dict[str, Any]:
        """Seconds per named term over M for a stack of n_layers (default: the model's), n_moe_layers of MoE."""
        a = self.a
        L = a.n_layers if n_layers is None else n_layers
        Lm = a.n_moe_layers if n_moe_layers is None else n_moe_layers
        Mf = np.asarray(M, float)
        out = {"attention_proj": L * self.attn_proj(M), "norms_rope_add_attnlaunch": L * self.layer_common(M),
               "tp_allreduce": L * 2 * self._ar(M)}
        out["dense_mlp"] = (L - Lm) * self.dense_mlp(M, dense_ffn) if L > Lm else np.zeros_like(Mf)
        if Lm:
            for k, v in self.moe(M).items():
                if k != "moe_active_experts_per_gpu":
                    out[k] = Lm * v
        out.update(self.head(M))
        return out

    def forward(self, M: Any, **kw: Any) -> Any:
        return sum(self.terms(M, **kw).values())

    # ------------------------------------------------------------------ context, memory
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies on one GPU (MLA: the latent + rope key, replicated over TP)."""
        a = self.a
        if a.is_mla:
            return a.n_layers * (a.kv_lora_rank + a.qk_rope_head_dim) * self.kvb
        return 2 * a.n_layers * self.kv_heads_per_gpu * a.head_dim * self.kvb

    def kv_bytes_per_token_engine(self) -> float:
        """KV-cache bytes of one token for the whole model, counted once (all layers; MLA: the latent + rope key,
        not its TP replicas; GQA: K and V of all n_kv_heads, not replicas): what a disaggregated deployment ships
        per prompt token from the prefill pool to a decode engine (``metadata.kv_bytes_per_token``)."""
        a = self.a
        if a.is_mla:
            return a.n_layers * (a.kv_lora_rank + a.qk_rope_head_dim) * self.kvb
        return 2 * a.n_layers * a.n_kv_heads * a.head_dim * self.kvb

    def seconds_per_kv_token(self) -> float:
        """Reading one context token's KV in decode attention (fitted large-transfer bandwidth)."""
        return self.kv_bytes_per_token() / (self.bw * self.eff.bw_max)

    def attn_flops_per_query_key(self) -> float:
        """FLOPs of one query attending one key on one GPU, all layers (QK^T and PV)."""
        a = self.a
        nh = a.n_heads / self.p.tp
        if a.is_mla:  # absorbed: scores over kv_lora + rope, values over kv_lora
            return a.n_layers * nh * 2.0 * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
        return a.n_layers * nh * 2.0 * (a.head_dim + a.v_head_dim)

    def seconds_per_query_key(self) -> float:
        """Seconds of one query-key pair's attention FLOPs (bf16 peak at the fitted large-GEMM fraction).

        The profile uses it twice, for disjoint pairs: ``prefill.seconds_per_query_key`` (the prefill chunks'
        causal pairs) and ``attention.seconds_per_query_kv`` (the decoding rows' pairs: 1 + L verified tokens over
        the request's context). It does not double count the ``kv_bandwidth`` term ``seconds_per_kv_token``: that
        one is BYTES (each decoding request's cache is read from HBM once per step, whatever its number of
        queries), this one is FLOPs (QK^T and PV per query per key). Real kernels overlap the two; adding them is
        the no-overlap bound (stated in metadata.build.not_modelled)."""
        return self.attn_flops_per_query_key() / (self.fl16 * self.eff.fl_max)

    def weight_bytes_per_gpu(self) -> dict[str, float]:
        """Weight bytes resident on one GPU, by part (embeddings, router and norms kept in 16 bit)."""
        a, p, w = self.a, self.p, self.wb
        tp, nh = p.tp, a.n_heads / p.tp
        if a.is_mla:
            attn = (a.hidden * (a.kv_lora_rank + a.qk_rope_head_dim) + a.hidden * (a.q_lora_rank or 0)
                    + (a.q_lora_rank or a.hidden) * nh * a.head_dim
                    + a.kv_lora_rank * nh * (a.qk_nope_head_dim + a.v_head_dim) + nh * a.v_head_dim * a.hidden)
        else:
            attn = a.hidden * (nh + 2 * self.kv_heads_per_gpu) * a.head_dim + nh * a.head_dim * a.hidden
        out = {"embedding_lm_head": 2.0 * a.vocab * a.hidden * 2 / tp, "attention": a.n_layers * attn * w,
               "dense_mlp": (a.n_layers - a.n_moe_layers) * 3 * a.hidden * a.ffn / tp * w}
        if a.is_moe:
            Lm = a.n_moe_layers
            out["router"] = Lm * a.hidden * a.n_experts * 2.0
            out["shared_experts"] = Lm * 3 * a.hidden * a.moe_ffn * a.n_shared_experts / tp * w
            out["routed_experts"] = Lm * (a.n_experts / p.ep) * 3 * a.hidden * a.moe_ffn / p.expert_tp * w
        return out

    def check_shapes(self) -> None:
        """InputError when the parallel layout does not divide the model (heads by tp, experts by ep)."""
        a, p = self.a, self.p
        if a.n_heads % p.tp:
            raise InputError("--tp", "tp", f"{p.tp} does not divide the {a.n_heads} attention heads of {a.name}")
        if p.ep > 1:
            if not a.is_moe:
                raise InputError("--ep", "ep", f"{a.name} is dense (no experts); expert parallelism needs an MoE model")
            if a.n_experts % p.ep:
                raise InputError("--ep", "ep", f"{p.ep} does not divide the {a.n_experts} routed experts of {a.name}")
            if p.gpus % p.ep:
                raise InputError("--ep", "ep", f"{p.ep} does not divide tp*dp = {p.gpus} GPUs")
        if a.is_moe and (a.moe_ffn % p.expert_tp):
            raise InputError("--tp", "tp", f"expert tensor-parallel degree {p.expert_tp} does not divide "
                                           f"moe_intermediate_size {a.moe_ffn}")
        if not math.isfinite(self.fl):
            raise InputError("--gpu", "gpu", "no peak FLOP/s")
