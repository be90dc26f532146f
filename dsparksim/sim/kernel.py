"""The compiled step kernel (numba): the numpy engines' steps for the supported runs (:mod:`dsparksim.sim.fastpath`
says which), the same operations on the same arrays, bit for bit.

One call of :func:`run_steps` runs the cluster's engines from their state until Python is needed (a request row to
load, acceptance draws to draw, a price term to look up, a log to grow, the run's end) and returns why (``X_*``).
The engines' steps are events in SimPy's order (time, then the order they were scheduled in: ``EV_EID``), and an
engine's event is resumable where Python may be needed (``PHASE``): issuing (each finished closed-loop user sends
its next request, routed as the router would), admission (drain the inbox, grow the paged KV, preempt, admit
FIFO) and planning (prefill chunks, the drawn confidences, the price, the policy's verify lengths; it changes nothing
until it succeeds). What Python does at an exit is what the numpy engine does at that point
(``PredrawnDraws.admit``/``take``, ``RequestTable.load``, ``CostProfile.step_overhead``), so every draw, price
and decision is the numpy engine's.

State: ``G``/``GF`` hold the run's int/float scalars, ``SS``/``FF`` each engine's (rows: engines; the slot names
below); ``T`` the request table's int64 columns (:data:`TABLE_INT`), ``TF`` its float columns
(:data:`TABLE_FLOAT`). Per engine (first axis): ``RUN`` the running rows in admission order, ``WQ`` the waiting
queue and ``IB`` the inbox (rings), ``FS`` the free slots (a stack), ``GAPS`` (engine, gap, 3) the preemption
gaps, ``LI``/``LF``/``LA`` (engine, step, column) the step log's int, float and accepted-per-position columns.
``DEC``/``LL``/``AA``/``CHR``/``CHL`` (engine, row) hold each engine's planned step until it ends: its decoding
rows, their verify lengths and true accepted prefixes, its chunks' rows and lengths. ``cs`` (rings x 2K: K
confidences, then K survivals) and ``pacc`` are the pre-drawn draws.
"""
from __future__ import annotations

import numpy as np

from dsparksim.sim.jit import njit_cached as njit   # numba: this module is the compiled path

# request phases (dsparksim.sim.requests)
WAITING, PREFILL, DECODE, DONE, REJECTED = 1, 2, 3, 4, 5

# the request table's columns the kernel reads and writes, in T / TF order
TABLE_INT = ("prompt", "out", "prefilled", "gen", "dsteps", "vtok", "atok", "slot_of", "regen", "pages", "preempt",
             "recomp", "demit")
PROMPT, OUT, PREFILLED, GEN, DSTEPS, VTOK, ATOK, SLOT, REGEN, PAGES, PREEMPT, RECOMP, DEMIT = range(13)
TABLE_FLOAT = ("arrival", "admitted", "first_tok", "finish")
ARRIVAL, ADMITTED, FIRST_TOK, FINISH = range(4)

# G slots (the run)
(ISSUED, AVAIL, EXHAUSTED, N_ROWS, N_REJECTED, STREAK, N_FINISHED, EID, CUR, CUT, ROUTER, TURN, MAX_STREAK,
 MAX_MODEL_LEN, ONCE_N, AUX, CHECK_EVERY, AHEAD_UPTO, RING, WRAP, KK, PAGE, N_PAGES, WM_PAGES, KV_CAP, PAGED,
 MAX_TOK, CHUNK, PF_NOTE, PF_DRAFTER, N_NEW, STEPS_DONE, NEED_ROW, POLICY, FIXED_K, N_G) = range(36)
# GF slots
(NOW, DURATION, ONCE_VAL, SPK, PF_TOK, PF_QK, PF_CH, PF_TOK_DEC, PF_CH_DEC, PF_DR_TOK, DENSE_HI, SQ, THRESHOLD,
 N_GF) = range(14)
# SS slots (an engine)
(PHASE, N_RUN, WQ_HEAD, WQ_LEN, IB_HEAD, IB_LEN, N_FREE, PAGES_USED, RESERVED, N_ADMITTED, N_STEPS, N_GAPS,
 PRE_PENDING, N_PREEMPTIONS, WAITING_NEED, PENDING, STEP_FIN, EV_EID, P_NDEC, P_NPF, P_KVREAD, P_PFQK, P_NCH, P_M,
 P_NRUN, P_KVPAGES, P_PRE, P_DECQK, CURSOR, PSTREAK, LOCAL, N_SS) = range(32)
# FF slots (an engine): its step's start, its price, the time of its next event
(T0, P_DT, EV_T, N_FF) = range(4)
# engine phases: where its current event is (ISSUE, ADMIT, PLAN) or what it waits for (STEP: its step's end;
# WAKE: a wake-up, scheduled; IDLE: a request routed to it)
ISSUE, ADMIT, PLAN, STEP, WAKE, IDLE = range(6)
# policies (dsparksim.policies): confidence (Algorithm 1), fixed:k, mtp1, threshold:t
P_CONFIDENCE, P_FIXED, P_MTP1, P_THRESHOLD = 0, 1, 2, 3
# routers (dsparksim.sim.routers): least-outstanding, round-robin, pinned (closed-loop users pinned to engines:
# engine e's users send rows e, e + n, e + 2n, ...)
R_LEAST_OUTSTANDING, R_ROUND_ROBIN, R_PINNED = 0, 1, 2
# LI columns (the numpy engine's log keys, dsparksim.sim.scheduler.LOG_KEYS, less t_start and dt; then the paged ones)
LOG_INT = ("n_decode", "n_prefill_tokens", "M", "verify_tokens", "emitted", "decode_emitted", "n_waiting",
           "n_running", "kv_used", "kv_read", "drafts", "accepted", "prefill_qk", "prefill_chunks", "decode_qk",
           "kv_pages", "preempted")

# exit codes
(X_STOP, X_ADMIT, X_REFILL, X_NT, X_ROWS, X_LOG, X_GAPS, X_NOTHING_FITS, X_EXHAUSTED, X_BUDGET, X_CHECK, X_DT,
 X_KV, X_QUEUE, X_PRICE) = range(15)
FIRST_PREFIX = 64   # dsparksim.policies.confidence.FIRST_PREFIX


@njit
def _kv_need(G, T, row):
    """KVManager.need: pages of prompt + regen (paged, in tokens) or prompt + output + K (reserve)."""
    if G[PAGED]:
        page = G[PAGE]
        return -(-(T[PROMPT][row] + T[REGEN][row]) // page) * page
    return T[PROMPT][row] + T[OUT][row] + G[KK]


@njit
def _preempt(G, S, T, phase, run, wq, fs, gaps, gapo, row):
    """Scheduler._preempt of the last running row ``row``."""
    T[RECOMP][row] += T[PREFILLED][row] + T[GEN][row] - T[REGEN][row]
    T[PREEMPT][row] += 1
    S[N_PREEMPTIONS] += 1
    S[PAGES_USED] -= T[PAGES][row]
    T[PAGES][row] = 0
    S[N_RUN] -= 1
    fs[S[N_FREE]] = T[SLOT][row]
    S[N_FREE] += 1
    if T[GEN][row] > 0 and gapo[row] < 0:
        g = S[N_GAPS]
        gaps[g, 0], gaps[g, 1], gaps[g, 2] = row, S[N_STEPS], -1
        gapo[row] = g
        S[N_GAPS] += 1
    T[REGEN][row] = T[GEN][row]
    T[PREFILLED][row] = 0
    phase[row] = WAITING
    S[WQ_HEAD] = (S[WQ_HEAD] - 1) & (wq.size - 1)
    wq[S[WQ_HEAD]] = row
    S[WQ_LEN] += 1
    S[WAITING_NEED] += _kv_need(G, T, row)
    S[PRE_PENDING] += 1


@njit
def _grow(G, S, T, phase, run, wq, fs, gaps, gapo):
    """Scheduler._grow: every decoding row gets the pages of context + K, preempting the last running row while
    they do not fit. Returns 1 if it preempted, -1 on a page overflow."""
    preempted = 0
    K, page = G[KK], G[PAGE]
    while S[N_RUN] > 0:
        held_sum, now_sum = 0, 0
        for idx in range(S[N_RUN]):
            row = run[idx]
            if phase[row] == DECODE:
                held = T[PAGES][row]
                want = (T[PREFILLED][row] + T[GEN][row] - T[REGEN][row] + (K + page - 1)) // page
                held_sum += held
                now_sum += want if want > held else held
        need = now_sum - held_sum
        if need > G[N_PAGES] - S[PAGES_USED]:
            _preempt(G, S, T, phase, run, wq, fs, gaps, gapo, run[S[N_RUN] - 1])
            preempted = 1
            continue
        if need:
            for idx in range(S[N_RUN]):
                row = run[idx]
                if phase[row] == DECODE:
                    want = (T[PREFILLED][row] + T[GEN][row] - T[REGEN][row] + (K + page - 1)) // page
                    if want > T[PAGES][row]:
                        T[PAGES][row] = want
        S[PAGES_USED] += need
        break
    if S[PAGES_USED] > G[N_PAGES]:
        return -1
    return preempted


@njit
def _drain(G, S, T, phase, replica, wq, ib, e):
    """Scheduler.drain: the inbox's rows join the waiting queue (FIFO). Returns 0, or X_QUEUE."""
    while S[IB_LEN] > 0:
        row = ib[S[IB_HEAD]]
        S[IB_HEAD] = (S[IB_HEAD] + 1) & (ib.size - 1)
        S[IB_LEN] -= 1
        if S[WQ_LEN] >= wq.size:
            return X_QUEUE
        phase[row] = WAITING
        replica[row] = e
        wq[(S[WQ_HEAD] + S[WQ_LEN]) & (wq.size - 1)] = row
        S[WQ_LEN] += 1
        S[WAITING_NEED] += _kv_need(G, T, row)
    return 0


@njit
def _admit(G, GF, S, T, TF, phase, run, wq, fs, newbuf, gaps, gapo):
    """Scheduler.admit at GF[NOW]: (paged) grow first -- a step that preempted admits nothing -- then FIFO while KV,
    slots and the token budget allow. The admitted rows go to ``newbuf[:G[N_NEW]]``. Returns 0, or X_KV."""
    G[N_NEW] = 0
    if G[PAGED]:
        g = _grow(G, S, T, phase, run, wq, fs, gaps, gapo)
        if g < 0:
            return X_KV
        if g:
            return 0
    K = G[KK]
    n_run, n_new = S[N_RUN], 0
    while S[WQ_LEN] > 0 and S[N_FREE] > 0:
        row = wq[S[WQ_HEAD]]
        if (n_run + 1) * (1 + K) > G[MAX_TOK]:
            break
        need = _kv_need(G, T, row)
        if G[PAGED]:
            pages, free = need // G[PAGE], G[N_PAGES] - S[PAGES_USED]
            if pages > free or (n_run > 0 and free - pages < G[WM_PAGES]):
                break
            T[PAGES][row] = pages
            S[PAGES_USED] += pages
        else:
            if S[RESERVED] + need > G[KV_CAP]:
                break
            S[RESERVED] += need
        S[WQ_HEAD] = (S[WQ_HEAD] + 1) & (wq.size - 1)
        S[WQ_LEN] -= 1
        S[WAITING_NEED] -= need
        S[N_FREE] -= 1
        T[SLOT][row] = fs[S[N_FREE]]
        phase[row] = PREFILL
        if T[PREEMPT][row] == 0:
            TF[ADMITTED][row] = GF[NOW]
        S[N_ADMITTED] += 1
        run[n_run] = row
        n_run += 1
        newbuf[n_new] = row
        n_new += 1
    S[N_RUN], G[N_NEW] = n_run, n_new
    return 0


@njit
def _sorted_prefix(keys, N, n, m, sbuf):
    """At least the m smallest of keys[:N], ascending, into sbuf; returns how many (the values
    policies._common.Ranking.keys gives: which of several equal keys comes first changes no value)."""
    if m <= 0:
        return 0
    if 4 * m >= N:
        sbuf[:N] = np.sort(keys[:N])
        return N
    if m < n:
        t = np.partition(keys[:n], m - 1)[m - 1]
        if t == t:
            c = 0
            for f in range(N):
                if keys[f] <= t:
                    sbuf[c] = keys[f]
                    c += 1
            sbuf[:c] = np.sort(sbuf[:c])
            return c
    sbuf[:m] = np.sort(np.partition(keys[:N], m - 1)[:m])
    return m


@njit
def _first_drop(n, sbuf, p, base, dense, extra, Tb, long_ctx):
    """policies.confidence.early_stop_ranked's scan over the first p ranked survivals: the first b whose ratio
    (n + their sum) / T(base + b) does not rise, p if none (the same running sum and divisions as numpy's). T is
    the dense price ``dense[M] + extra``, or with the long-context term the prices in ``Tb``."""
    E = float(n)
    prev = E / (Tb[0] if long_ctx else dense[base] + extra)
    for b in range(1, p + 1):
        E = E + (-sbuf[b - 1])
        r = E / (Tb[b] if long_ctx else dense[base + b] + extra)
        if r - prev <= 0:
            return b - 1
        prev = r
    return p


@njit
def _dense_prices_ok(base, bmax, dense, extra):
    """policies._common.eval_times of DenseStepTime over M = base .. base + bmax: every price positive and finite."""
    for M in range(base, base + bmax + 1):
        t = dense[M] + extra
        if not (t > 0 and np.isfinite(t)):
            return False
    return True


@njit
def _long_context_prices(base, bmax, dense, extra, sq, qk0, per, Tb):
    """DecodeQKStepTime over M = base .. base + bmax into Tb (every extra verified token at the decoding rows' mean
    context ``per``), checked as policies._common.eval_times checks them: False if one is not positive and
    finite."""
    for b in range(bmax + 1):
        M = base + b
        t = (dense[M] + extra) + sq * (qk0 + (M - base) * per)
        if not (t > 0 and np.isfinite(t)):
            return False
        Tb[b] = t
    return True


@njit
def _lengths(n, K, j, keys, sbuf, L):
    """policies._common.Ranking.lengths: the verify lengths when the first j ranked candidates are admitted (keys
    k-major: f = k n + i)."""
    for i in range(n):
        L[i] = 0
    if j <= 0:
        return
    v = sbuf[j - 1]
    le = 0
    for k in range(K):
        for i in range(n):
            if keys[k * n + i] <= v:
                L[i] += 1
                le += 1
    if le == j:
        return
    # ties beyond the j-th: the keys below v, then the first equal ones in flat order (the stable sort's order)
    rest = j
    for i in range(n):
        L[i] = 0
    for k in range(K):
        for i in range(n):
            if keys[k * n + i] < v:
                L[i] += 1
                rest -= 1
    for k in range(K):
        for i in range(n):
            if rest > 0 and keys[k * n + i] == v:
                L[i] += 1
                rest -= 1


@njit
def _confidence(n, K, base, max_tok, cs, pos, dense, extra, keys, sbuf, L, Tb, long_ctx):
    """policies.confidence.algorithm1 on the drawn survivals of the n decoding rows (ring rows ``pos``): their
    verify lengths into L[:n] (``Tb``: the candidates' prices with the long-context term)."""
    N = n * K
    for i in range(n):      # a ring row's survivals are adjacent: read them together
        r = pos[i]
        for k in range(K):
            keys[k * n + i] = -cs[r, K + k]
    bmax = min(max_tok - base, N)
    m = FIRST_PREFIX
    while True:
        p = min(_sorted_prefix(keys, N, n, min(m, bmax), sbuf), bmax)
        j = _first_drop(n, sbuf, p, base, dense, extra, Tb, long_ctx)
        if j < p or p == bmax:
            break
        m *= 4
    _lengths(n, K, j, keys, sbuf, L)


@njit
def _verify_lengths(G, GF, n, K, base, cs, pos, dense, extra, keys, sbuf, L, Tb, long_ctx):
    """The policy's verify lengths of the n decoding rows into L[:n]: confidence (Algorithm 1), or fixed:k, mtp1
    and threshold:t, each capped lowest index first at the step's draft budget (policies._common
    .cap_lowest_index_first: min(max_tokens - base, n K) tokens)."""
    if G[POLICY] == P_CONFIDENCE:
        _confidence(n, K, base, G[MAX_TOK], cs, pos, dense, extra, keys, sbuf, L, Tb, long_ctx)
        return
    for i in range(n):
        if G[POLICY] == P_FIXED:
            L[i] = min(G[FIXED_K], K)
        elif G[POLICY] == P_MTP1:
            L[i] = 1 if K >= 1 else 0
        else:   # threshold: the survivals >= t form a prefix (non-increasing along the block)
            c = 0
            for k in range(K):
                if cs[pos[i], K + k] >= GF[THRESHOLD]:
                    c += 1
            L[i] = c
    budget = min(G[MAX_TOK] - base, n * K)
    before = 0
    for i in range(n):
        li = L[i]
        L[i] = min(max(budget - before, 0), li)
        before += li


@njit
def _chunks(G, S, T, phase, run, n_dec, chunk_rows, chunk_len):
    """Scheduler._chunks (mixed prefill): FIFO chunks of the prefilling rows within the budget left beside the
    decode rows; (chunks, tokens, query-key pairs)."""
    budget = min(G[CHUNK], G[MAX_TOK] - n_dec * (1 + G[KK]))
    n_ch, n_pf, pf_qk = 0, 0, 0
    if n_dec < S[N_RUN]:
        for idx in range(S[N_RUN]):
            row = run[idx]
            if phase[row] != PREFILL:
                continue
            if budget <= 0:
                break
            done = T[PREFILLED][row]
            c = min(T[PROMPT][row] + T[REGEN][row] - done, budget)
            chunk_rows[n_ch], chunk_len[n_ch] = row, c
            n_ch += 1
            budget -= c
            n_pf += c
            pf_qk += c * done + c * (c + 1) // 2
    return n_ch, n_pf, pf_qk


@njit
def _step_extra(G, GF, NT, NTok, n_dec, n_pf, pf_qk, n_ch, kv):
    """(0, the step's price beyond the verify staircase: StepPricer.step_time's DenseStepTime ``extra``), or
    (X_NT, 0) when the term for n_dec decoding rows must be looked up first (G[AUX] = n_dec)."""
    if NTok[n_dec]:
        nt = NT[n_dec]
    elif G[ONCE_N] == n_dec:
        nt = GF[ONCE_VAL]
    else:
        G[AUX] = n_dec
        return X_NT, 0.0
    if n_pf and G[PF_NOTE]:
        # CostProfile.prefill_time, term by term in its order
        p = GF[PF_TOK] * n_pf + GF[PF_QK] * pf_qk + GF[PF_CH] * n_ch
        if n_dec:
            p += (GF[PF_TOK_DEC] * n_pf + GF[PF_CH_DEC] * n_ch) * n_dec
        if G[PF_DRAFTER]:
            p += GF[PF_DR_TOK] * n_pf
        nt = nt + p
    return 0, nt + GF[SPK] * kv


@njit
def _plan(G, GF, S, F, T, phase, run, entry, cs, pacc, filled, NT, NTok, dense, dec, pos, L, A, chunk_rows,
          chunk_len, keys, sbuf, Tb):
    """Scheduler.plan_step: the step's rows, chunks, draws, price and verify lengths into the P_* slots and the
    plan arrays. Returns 0, -1 if nothing runs, or the exit code of what Python must do first (nothing changed)."""
    if S[N_RUN] == 0:
        return -1
    K, R, wrap = G[KK], G[RING], G[WRAP]
    n_dec, kv = 0, 0
    for idx in range(S[N_RUN]):
        row = run[idx]
        kv += T[PREFILLED][row] + T[GEN][row] - T[REGEN][row]
        if phase[row] == DECODE:
            dec[n_dec] = row
            n_dec += 1
    n_ch, n_pf, pf_qk = _chunks(G, S, T, phase, run, n_dec, chunk_rows, chunk_len)
    kv += n_pf
    for i in range(n_dec):
        row = dec[i]
        e, st = entry[row], T[DSTEPS][row]
        if filled[e] <= st:
            G[AUX] = n_dec
            return X_REFILL
        pos[i] = e * R + (st & wrap if wrap else st % R)
    code, extra = _step_extra(G, GF, NT, NTok, n_dec, n_pf, pf_qk, n_ch, kv)
    if code:
        return code
    base = n_dec + n_pf
    long_ctx = GF[SQ] != 0 and n_dec > 0
    if G[POLICY] == P_CONFIDENCE and n_dec:     # the one policy here that reads the prices
        if long_ctx:
            # the long-context term (Scheduler.plan_step): candidates priced at the decoding rows' mean context
            qk0 = 0
            for i in range(n_dec):
                row = dec[i]
                qk0 += T[PREFILLED][row] + T[GEN][row] - T[REGEN][row]
            if not _long_context_prices(base, min(G[MAX_TOK] - base, n_dec * K), dense, extra, GF[SQ], float(qk0),
                                        float(qk0) / n_dec, Tb):
                return X_PRICE
        elif not (extra >= 0 and np.isfinite(GF[DENSE_HI] + extra)):
            # DenseStepTime.checked is False: the numpy policy checks the prices it reads (eval_times over M = base
            # .. base + its budget), and so does the kernel
            if not _dense_prices_ok(base, min(G[MAX_TOK] - base, n_dec * K), dense, extra):
                return X_PRICE
    n_verify, dec_qk = 0, 0
    if n_dec:
        _verify_lengths(G, GF, n_dec, K, base, cs, pos, dense, extra, keys, sbuf, L, Tb, long_ctx)
        for i in range(n_dec):
            n_verify += L[i]
            A[i] = pacc[pos[i]]
    M = base + n_verify
    if M > G[MAX_TOK]:
        G[AUX] = M
        return X_BUDGET
    dt = dense[M] + extra
    if long_ctx:
        for i in range(n_dec):    # decode_query_keys: (1 + L) c + L (L + 1) / 2 per decoding row
            row = dec[i]
            c = T[PREFILLED][row] + T[GEN][row] - T[REGEN][row]
            dec_qk += (1 + L[i]) * c + L[i] * (L[i] + 1) // 2
        dt += GF[SQ] * dec_qk
    if not dt > 0:
        return X_DT
    if G[ONCE_N] == n_dec and not NTok[n_dec]:
        G[ONCE_N] = -1           # the looked-up term serves this step only (the numpy engine looks it up each step)
    S[P_NDEC], S[P_NPF], S[P_KVREAD], S[P_PFQK], S[P_NCH], S[P_M] = n_dec, n_pf, kv, pf_qk, n_ch, M
    S[P_NRUN], S[P_KVPAGES], S[P_PRE], S[P_DECQK] = S[N_RUN], S[PAGES_USED], S[PRE_PENDING], dec_qk
    S[PRE_PENDING] = 0
    F[P_DT] = dt
    return 0


@njit
def _finish_rows(G, S, T, TF, phase, run, fs, fin, n_fin, now):
    """Scheduler._finish: the finished rows leave the running rows (order kept), give back their KV and slots."""
    for i in range(n_fin):
        row = fin[i]
        phase[row] = DONE
        TF[FINISH][row] = now
    c = 0
    for idx in range(S[N_RUN]):
        row = run[idx]
        if phase[row] != DONE:
            run[c] = row
            c += 1
    S[N_RUN] = c
    for i in range(n_fin):
        row = fin[i]
        if G[PAGED]:
            S[PAGES_USED] -= T[PAGES][row]
            T[PAGES][row] = 0
        else:
            S[RESERVED] -= T[PROMPT][row] + T[OUT][row] + G[KK]
        fs[S[N_FREE]] = T[SLOT][row]
        S[N_FREE] += 1


@njit
def _decode_rows(G, S, T, LA, step, dec, L, A, fin):
    """Scheduler.apply's decode half (the CostExecutor's outcome: accepted = min(L, true prefix)): (tokens
    emitted, drafts, accepted, finished rows put into ``fin``)."""
    emitted, drafts, acc_total, n_fin = 0, 0, 0, 0
    for p in range(G[KK]):
        LA[step, p] = 0
    for i in range(S[P_NDEC]):
        row = dec[i]
        a = min(L[i], A[i])
        if L[i] > 0:
            drafts += 1
        acc_total += a
        for p in range(a):
            LA[step, p] += 1
        emit = min(a + 1, T[OUT][row] - T[GEN][row])
        T[GEN][row] += emit
        T[DEMIT][row] += emit
        T[DSTEPS][row] += 1
        T[VTOK][row] += L[i]
        T[ATOK][row] += a
        emitted += emit
        if T[GEN][row] >= T[OUT][row]:
            fin[n_fin] = row
            n_fin += 1
    return emitted, drafts, acc_total, n_fin


@njit
def _apply(G, S, F, T, TF, phase, run, fs, gaps, gapo, dec, L, A, chunk_rows, chunk_len, fin, LI, LF, LA, t_end):
    """Scheduler.apply and Scheduler.record of the engine's planned step, ending at ``t_end``; the finished rows
    into ``fin``, their count returned."""
    step = S[N_STEPS]
    emitted, drafts, acc_total, n_fin = _decode_rows(G, S, T, LA, step, dec, L, A, fin)
    decode_emitted = emitted
    for c in range(S[P_NCH]):
        row = chunk_rows[c]
        T[PREFILLED][row] += chunk_len[c]
        if T[PREFILLED][row] == T[PROMPT][row] + T[REGEN][row]:
            phase[row] = DECODE
            if T[REGEN][row] == 0:
                TF[FIRST_TOK][row] = t_end
            elif gapo[row] >= 0:
                gaps[gapo[row], 2] = step
                gapo[row] = -1
            T[GEN][row] += 1
            emitted += 1
            if T[GEN][row] >= T[OUT][row]:
                fin[n_fin] = row
                n_fin += 1
    if n_fin:
        _finish_rows(G, S, T, TF, phase, run, fs, fin, n_fin, t_end)
    n_dec, n_pf, M = S[P_NDEC], S[P_NPF], S[P_M]
    LF[step, 0], LF[step, 1] = F[T0], F[P_DT]
    kv_used = S[P_KVPAGES] * G[PAGE] if G[PAGED] else S[P_KVREAD] + S[P_NRUN] * G[KK]
    LI[step, 0], LI[step, 1], LI[step, 2], LI[step, 3] = n_dec, n_pf, M, M - n_dec - n_pf
    LI[step, 4], LI[step, 5], LI[step, 6], LI[step, 7] = emitted, decode_emitted, S[WQ_LEN], S[P_NRUN]
    LI[step, 8], LI[step, 9], LI[step, 10], LI[step, 11] = kv_used, S[P_KVREAD], drafts, acc_total
    LI[step, 12], LI[step, 13], LI[step, 14] = S[P_PFQK], S[P_NCH], S[P_DECQK]
    LI[step, 15], LI[step, 16] = S[P_KVPAGES], S[P_PRE]
    S[N_STEPS] += 1
    return n_fin


@njit
def _outstanding(SS, e):
    """Scheduler.outstanding: running + waiting + in the inbox."""
    return SS[e, N_RUN] + SS[e, WQ_LEN] + SS[e, IB_LEN]


@njit
def _route(G, GF, SS, FF, IB, row):
    """Simulation._route: the router's engine for ``row`` (least-outstanding: fewest outstanding, ties from its
    turn on; round-robin: its turn; pinned: row mod n), into that engine's inbox, waking it if it waits idle. Returns 0 or X_QUEUE."""
    n = SS.shape[0]
    if G[ROUTER] == R_PINNED:
        e = row % n
    else:
        start = G[TURN]
        G[TURN] = (start + 1) % n     # Router.turn
        e = start % n
    if G[ROUTER] == R_LEAST_OUTSTANDING:
        for k in range(1, n):
            i = (start + k) % n
            if _outstanding(SS, i) < _outstanding(SS, e):
                e = i
    S, ib = SS[e], IB[e]
    if S[IB_LEN] >= ib.size:
        return X_QUEUE
    ib[(S[IB_HEAD] + S[IB_LEN]) & (ib.size - 1)] = row
    S[IB_LEN] += 1
    if S[PHASE] == IDLE:        # Driver.wake: its process resumes after the events already scheduled
        S[PHASE] = WAKE
        FF[e, EV_T] = GF[NOW]
        S[EV_EID] = G[EID]
        G[EID] += 1
    return 0


@njit
def _has_row(G, row):
    """Whether workload row ``row`` exists: 1 yes, 0 no, -1 not known until Python loads it (G[NEED_ROW])."""
    if G[N_ROWS] >= 0 and row >= G[N_ROWS]:
        return 0
    if row < G[AVAIL]:
        return 1
    if G[EXHAUSTED]:
        return 0
    G[NEED_ROW] = row
    return -1


@njit
def _reject_reason(G, T, row):
    """Scheduler.reject_reason: 0, or why ``row`` can never be served (1: max_model_len, 2: the KV capacity)."""
    total = T[PROMPT][row] + T[OUT][row]
    if G[MAX_MODEL_LEN] >= 0 and total > G[MAX_MODEL_LEN]:
        return 1
    if G[PAGED]:
        return 2 if -(-(total + G[KK]) // G[PAGE]) > G[N_PAGES] else 0
    return 2 if total + G[KK] > G[KV_CAP] else 0


@njit
def _issue(G, GF, SS, FF, T, TF, phase, reject, IB, row):
    """Simulation._issue: ``row`` arrives now; routed (returns 0, or X_QUEUE) or rejected (returns -1)."""
    TF[ARRIVAL][row] = GF[NOW]
    G[ISSUED] += 1
    reason = _reject_reason(G, T, row)
    if reason:
        phase[row] = REJECTED
        reject[row] = reason
        G[N_REJECTED] += 1
        G[STREAK] += 1
        return -1
    G[STREAK] = 0
    return _route(G, GF, SS, FF, IB, row)


@njit
def _issue_user(G, GF, SS, FF, T, TF, phase, reject, IB):
    """Simulation._issue_user (closed loop): a free user sends rows until one is routed (a rejected one is answered
    at once). Returns 0, X_ROWS (Python loads row G[NEED_ROW] and the user goes on), X_NOTHING_FITS or X_QUEUE."""
    while G[N_ROWS] < 0 or G[ISSUED] < G[N_ROWS]:
        has = _has_row(G, G[ISSUED])
        if has <= 0:
            return X_ROWS if has < 0 else 0
        code = _issue(G, GF, SS, FF, T, TF, phase, reject, IB, G[ISSUED])
        if code >= 0:
            return code
        idle = True
        admitted = 0
        for i in range(SS.shape[0]):
            idle = idle and _outstanding(SS, i) == 0
            admitted += SS[i, N_ADMITTED]
        if G[STREAK] >= G[MAX_STREAK] or (admitted == 0 and G[N_REJECTED] >= 1000 and idle):
            return X_NOTHING_FITS
    return 0


@njit
def _issue_pinned(G, GF, SS, FF, T, TF, phase, reject, IB, e):
    """Simulation._issue_pinned: a free user of engine e sends that engine's next rows until one is routed (the
    rejection guard counts per engine)."""
    S, n = SS[e], SS.shape[0]
    while True:
        row = e + S[CURSOR] * n
        has = _has_row(G, row)
        if has <= 0:
            return X_ROWS if has < 0 else 0
        S[CURSOR] += 1
        code = _issue(G, GF, SS, FF, T, TF, phase, reject, IB, row)
        if code >= 0:
            S[PSTREAK] = 0
            return code
        S[PSTREAK] += 1
        if S[PSTREAK] >= G[MAX_STREAK] or (S[N_ADMITTED] == 0 and S[PSTREAK] >= 1000 and _outstanding(SS, e) == 0):
            return X_NOTHING_FITS


@njit
def _more_rows(G, SS):
    """Simulation._maybe_done's ``more``: a user has a row left to send (1), none (0), or -1: Python must load one
    first. Pinned: any engine of this shard (its users send its rows)."""
    if G[ROUTER] != R_PINNED:
        return _has_row(G, G[ISSUED])
    for e in range(SS.shape[0]):
        if SS[e, LOCAL]:
            has = _has_row(G, e + SS[e, CURSOR] * SS.shape[0])
            if has != 0:
                return has
    return 0


@njit
def _issue_all(G, GF, SS, FF, T, TF, phase, reject, IB, e):
    """Simulation._on_finish (closed loop) after engine e's step: each finished user sends its next request (pinned:
    on its engine, e), then the run ends if nothing is left (_maybe_done). Resumable: SS[e, PENDING] users are
    left to send."""
    S = SS[e]
    while S[PENDING] > 0:
        if G[ROUTER] == R_PINNED:
            code = _issue_pinned(G, GF, SS, FF, T, TF, phase, reject, IB, e)
        else:
            code = _issue_user(G, GF, SS, FF, T, TF, phase, reject, IB)
        if code:
            return code
        S[PENDING] -= 1
    if S[STEP_FIN]:
        for i in range(SS.shape[0]):
            if _outstanding(SS, i):
                return 0
        more = _more_rows(G, SS)
        if more:
            return X_ROWS if more < 0 else 0
        return X_EXHAUSTED
    return 0


@njit
def _next_event(SS, FF):
    """The engine whose event comes next (SimPy's order: time, then scheduling order); -1 if every engine idles."""
    best = -1
    for e in range(SS.shape[0]):
        if SS[e, PHASE] == STEP or SS[e, PHASE] == WAKE:
            if best < 0 or FF[e, EV_T] < FF[best, EV_T] or (FF[e, EV_T] == FF[best, EV_T]
                                                             and SS[e, EV_EID] < SS[best, EV_EID]):
                best = e
    return best


@njit
def _pick(G, GF, SS, FF, LI, GAPS):
    """The next event's engine, made current (G[CUR]), or an exit code as -1 - code: the horizon (SimPy's stop
    comes first at the horizon: events scheduled before it still run there, later ones do not), a log or gap
    table to grow."""
    e = _next_event(SS, FF)
    if e < 0:
        return -1 - X_STOP
    t = FF[e, EV_T]
    if t > GF[DURATION]:
        return -1 - X_STOP
    if t == GF[DURATION]:
        if G[CUT] < 0:
            G[CUT] = G[EID]
        if SS[e, EV_EID] >= G[CUT]:
            return -1 - X_STOP
    if SS[e, N_STEPS] >= LI.shape[1]:
        return -1 - X_LOG
    if SS[e, N_GAPS] + SS[e, N_RUN] >= GAPS.shape[1]:
        return -1 - X_GAPS
    G[CUR] = e
    GF[NOW] = t
    return e


@njit
def _admitted_need_python(G, entry, newbuf):
    """PredrawnDraws.admit has work to do for the rows just admitted (draws ahead, or a row without draws)."""
    for i in range(G[N_NEW]):
        row = newbuf[i]
        if entry[row] == 0 or row >= G[AHEAD_UPTO]:
            return True
    return False


@njit
def run_steps(G, GF, SS, FF, T, TF, phase, reject, replica, entry, cs, pacc, filled, RUN, WQ, IB, FS, newbuf, GAPS,
              gapo, dense, NT, NTok, LI, LF, LA, DEC, pos, LL, AA, CHR, CHL, fin, keys, sbuf, Tb):
    """Run the engines' events until Python is needed (see the module doc); returns the exit code."""
    done_here = 0
    while True:
        e = G[CUR]
        if e < 0:
            if done_here >= G[CHECK_EVERY]:
                return X_CHECK
            e = _pick(G, GF, SS, FF, LI, GAPS)
            if e < 0:
                return -1 - e
            S, F = SS[e], FF[e]
            if S[PHASE] == STEP:
                n_fin = _apply(G, S, F, T, TF, phase, RUN[e], FS[e], GAPS[e], gapo, DEC[e], LL[e], AA[e], CHR[e],
                               CHL[e], fin, LI[e], LF[e], LA[e], GF[NOW])
                G[N_FINISHED] += n_fin
                S[PENDING], S[STEP_FIN] = n_fin, n_fin
                S[PHASE] = ISSUE
                done_here += 1
            else:
                S[PHASE] = ADMIT
        S, F = SS[e], FF[e]
        if S[PHASE] == ISSUE:
            code = _issue_all(G, GF, SS, FF, T, TF, phase, reject, IB, e)
            if code:
                return code
            S[STEP_FIN] = 0
            S[PHASE] = ADMIT
        if S[PHASE] == ADMIT:
            code = _drain(G, S, T, phase, replica, WQ[e], IB[e], e)
            if code == 0:
                code = _admit(G, GF, S, T, TF, phase, RUN[e], WQ[e], FS[e], newbuf, GAPS[e], gapo)
            if code:
                return code
            S[PHASE] = PLAN
            if G[N_NEW] and _admitted_need_python(G, entry, newbuf):
                return X_ADMIT
        code = _plan(G, GF, S, F, T, phase, RUN[e], entry, cs, pacc, filled, NT, NTok, dense, DEC[e], pos, LL[e],
                     AA[e], CHR[e], CHL[e], keys, sbuf, Tb)
        if code > 0:
            return code
        if code < 0:
            S[PHASE] = IDLE      # nothing runs: it waits for a request routed to it
        else:
            S[PHASE] = STEP
            F[T0] = GF[NOW]
            F[EV_T] = GF[NOW] + F[P_DT]
            S[EV_EID] = G[EID]
            G[EID] += 1
        G[CUR] = -1
