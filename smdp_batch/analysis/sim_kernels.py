"""The simulator's event loops (numba): one FIFO queue, a rule deciding each batch.

* :func:`_kernel` — table rules at decision epochs, table + timer rules (a table with a guard on the oldest
  request's wait, as :class:`~smdp_batch.runtime.DynamicBatcher` runs it) and the servers' timeout rules
  (modes of :data:`MODES`), on one server or on c instances sharing the queue (Triton's ``instance_group``;
  busy-aware tables there, with a row per busy count, decide at batch ends too: :func:`_busy_now`);
* :func:`_context_kernel` — a table chosen at each epoch by a context: the λ-bank's index after the
  last arrival, the true MAP phase, or the phase filter's belief (:data:`CTX_ARRIVAL` …);
* :func:`phase_beliefs` — the filter of :mod:`smdp_batch.runtime.phase` over a whole stream (its
  exponential :func:`_expm` is the runtime's, written with loops for numba).

Both loops share :func:`_serve` (one batch: response times, energy shares per statistics group,
histograms).  :mod:`.simulate` draws the inputs and summarises.
"""

from __future__ import annotations

import numpy as np

from ..kernel_cache import njit  # numba's njit, its cache keyed by every kernel file

__all__ = ["MODES", "CTX_ARRIVAL", "CTX_PATH", "CTX_LIKELY", "CTX_QMDP", "phase_beliefs"]

#: Rule kinds understood by the kernel.
MODES = {"table": 0, "triton": 1, "ray": 2, "torchserve": 3, "timer": 4, "timer-pad": 5,
         "busy": 4}  # a busy-aware table is the table + timer loop with τ = ∞ (it asks its row at batch ends too)


@njit(cache=True, inline="always")
def _duration(s_exec, lat_of, det, pool_of, unit, ptr):
    """The time (ms) of a batch executed at size ``s_exec``: l(s), or l(s) times the next draw of its pool."""
    if det:
        return lat_of[s_exec]
    pool = pool_of[s_exec]
    ptr[pool] += 1
    return lat_of[s_exec] * unit[pool, ptr[pool] - 1]


@njit(cache=True, inline="always")
def _serve(arr, head, nxt, size, start, pad, lat_of, en_of, det, pool_of, unit, ptr, resp, bounds, genergy,
           sizes_hist, qhist, grp):
    """Run one batch of ``size`` requests from ``head`` at ``start``: response times, energy shares per
    statistics group, histograms.  Returns (completion time, group)."""
    s_exec = pad[size]
    done = start + _duration(s_exec, lat_of, det, pool_of, unit, ptr)
    share = en_of[s_exec] / size
    n_groups = genergy.size
    for j in range(head, head + size):
        resp[j] = done - arr[j]
        while grp < n_groups and j >= bounds[grp + 1]:
            grp += 1
        if grp < n_groups and j >= bounds[0]:
            genergy[grp] += share
    sizes_hist[s_exec] += 1
    qhist[min(nxt - head, qhist.size - 1)] += 1
    return done, grp


@njit(cache=True, inline="always")
def _book(i, done, share, arr, resp, bounds, genergy):
    """Request i, ended at ``done`` (ms): its response time, and its energy share to its statistics group (none
    before bounds[0], the warm-up).  For batches whose requests are not consecutive or end out of order."""
    resp[i] = done - arr[i]
    if i >= bounds[0]:
        g = np.searchsorted(bounds, i, side="right") - 1
        if g < genergy.size:
            genergy[g] += share


@njit(cache=True)
def _advance(t, run, rem, extra, slow, efac, lat_of, en_of, arr, resp, bounds, genergy, state):
    """Contention: run the instances' batches from the clock (state[5]) to ``t`` (ms; ∞ finishes them all).

    ``run[i]`` = (first request, size, executed size) of instance i's batch, size 0 when idle; ``rem[i]`` its
    remaining work in ms of a batch run alone.  While k are busy a batch executed at size e progresses at speed
    1/slow[k, e] and accrues (efac[k, e] − 1)·ζ/l mJ per ms of work beyond the ζ charged in full at its end (a
    batch run entirely at level k: e_k·ζ on average).  A batch that ends writes its requests' response times
    and energy shares; state[6] adds the busy instance-time."""
    clock = state[5]
    c = rem.size
    while True:
        k = 0
        for i in range(c):
            if run[i, 1] > 0:
                k += 1
        if k == 0:
            if t > clock and t < np.inf:
                clock = t
            break
        dt, first = _first_end(run, rem, slow, k)
        done = clock + dt
        ends = done <= t
        if not ends:  # nothing ends before t: every batch runs on to t
            dt = t - clock
            done = t
        for i in range(c):
            if run[i, 1] > 0:
                e = run[i, 2]
                w = dt / slow[k, e]
                rem[i] -= w
                extra[i] += (efac[k, e] - 1.0) * en_of[e] / lat_of[e] * w
        state[6] += (done - clock) * k
        clock = done
        if not ends:
            break
        head, size, e = run[first, 0], run[first, 1], run[first, 2]
        share = (en_of[e] + extra[first]) / size
        for j in range(head, head + size):
            _book(j, done, share, arr, resp, bounds, genergy)
        run[first, 1] = 0
        rem[first] = 0.0
        extra[first] = 0.0
    state[5] = clock


@njit(cache=True)
def _next_free(run, rem, slow, state):
    """Contention: when an instance is next free (ms): now if one is idle, else the earliest end at the busy
    speeds."""
    k = 0
    for i in range(rem.size):
        if run[i, 1] > 0:
            k += 1
    if k < rem.size:
        return state[5]
    return state[5] + _first_end(run, rem, slow, k)[0]


@njit(cache=True, inline="always")
def _first_end(run, rem, slow, k):
    """Contention: (the time in ms until the first of the k running batches ends at the speeds of level k, the
    instance it runs on)."""
    dt = np.inf
    first = -1
    for i in range(rem.size):
        if run[i, 1] > 0:
            d = max(rem[i], 0.0) * slow[k, run[i, 2]]
            if d < dt:
                dt = d
                first = i
    return dt, first


@njit(cache=True)
def _busy_now(tau, free, cont, run, rem, extra, slow, efac, lat_of, en_of, arr, resp, bounds, genergy, state):
    """(instances busy at ``tau``, when the next of their batches ends, ∞ if none) while nothing starts: under
    contention the running batches are first advanced to ``tau`` (:func:`_advance`) and end at the busy speed."""
    busy = 0
    end = np.inf
    if cont:
        _advance(tau, run, rem, extra, slow, efac, lat_of, en_of, arr, resp, bounds, genergy, state)
        for i in range(rem.size):
            if run[i, 1] > 0:
                busy += 1
        if busy > 0:
            end = state[5] + _first_end(run, rem, slow, busy)[0]
    else:
        for i in range(free.size):
            if free[i] > tau:
                busy += 1
                end = min(end, free[i])
    return busy, end


@njit(cache=True, nogil=True)  # the SLO search runs rule families on threads
def _kernel(arr, mode, table, top, maxb, pref, delay, pad, lat_of, en_of, det, pool_of, unit, ptr, resp,
            bounds, genergy, sizes_hist, qhist, state, stop, free, cont, slow, efac, run, rem, extra):
    """Serve requests until request ``stop`` is reached (resumable: ``state`` = head, next, the latest batch
    start, group; ``free`` = the time each of the c instances is free from).

    c instances share one FIFO queue: the rule decides each batch, one after the other, as if for one server
    that is free from max(earliest instance free, the latest batch start) on, and the batch runs on the
    instance free earliest (for c = 1 the single server of paper 004).  Fills resp per served request and
    adds each request's energy share ζ(b)/b to its statistics group (groups start at ``bounds[g]``; requests
    before bounds[0] are warm-up).  Returns the number of batches served, or −1 if the rule waits forever
    (no more arrivals): the run is then complete.

    ``cont``: the instances contend (:mod:`smdp_batch.specs.contention`): a batch's end is not known when it
    starts, so the running batches live in ``run``/``rem``/``extra`` and :func:`_advance` ends them (the caller
    finishes the last with ``_advance(∞)``).

    ``state[7]`` counts the batches the rule's timer closed (its delay ran out, or a delay of 0 served what waited
    below a full batch) among those holding requests of the stream (before ``bounds[-1]``; a continuation's last
    batch always waits out its timer): where a run counts none, any longer delay serves the stream's requests in
    the same batches.
    """
    n_req = arr.size
    rows = table.size // (top + 1)  # a busy-aware table (modes 4, 5): a row per busy count
    head = int(state[0])
    nxt = int(state[1])
    last = state[2]  # the latest batch start: batches leave the queue in order
    grp = int(state[3])
    batches = 0
    tau = last
    while head < stop:
        k = 0
        for i in range(1, free.size):
            if free[i] < free[k]:
                k = i
        # the next batch is decided from then on
        tau = max(_next_free(run, rem, slow, state) if cont else free[k], last)
        while nxt < n_req and arr[nxt] <= tau:
            nxt += 1
        n = nxt - head
        size = 0
        start = tau
        if mode == 0:  # table at decision epochs
            while True:
                a = table[min(n, top)]
                if a > 0:
                    size = a
                    start = tau
                    break
                if nxt >= n_req:
                    break
                tau = arr[nxt]
                nxt += 1
                n += 1
        elif mode == 1:  # Triton dynamic batcher / TF-Serving scheduler
            while True:
                if n == 0:
                    if nxt >= n_req:
                        break
                    tau = arr[nxt]
                    nxt += 1
                    n = 1
                    continue
                cap = min(n, maxb)
                p = 0
                for q in pref:
                    if q <= cap and q > p:
                        p = q
                if p > 0:
                    size = p
                    start = tau
                    break
                if pref.size == 0 and n >= maxb:
                    size = cap
                    start = tau
                    break
                if delay <= 0.0:
                    size = cap
                    start = tau
                    state[7] += head < bounds[-1]
                    break
                deadline = arr[head] + delay
                if deadline <= tau:
                    size = cap
                    start = tau
                    state[7] += head < bounds[-1]
                    break
                if nxt < n_req and arr[nxt] < deadline:
                    tau = arr[nxt]
                    nxt += 1
                    n += 1
                    continue
                tau = deadline
                size = cap
                start = tau
                state[7] += head < bounds[-1]
                break
        elif mode == 2:  # Ray Serve: batches close by time or size whatever the executor does, then run FIFO
            m = 1
            deadline = arr[head] + delay
            while head + m < n_req and m < maxb and arr[head + m] <= deadline:
                m += 1
            close = deadline if m < maxb else arr[head + m - 1]
            if m < maxb:
                state[7] += head < bounds[-1]
            size = m
            start = max(close, tau)
            tau = start
            while nxt < n_req and arr[nxt] <= start:
                nxt += 1
        elif mode == 4 or mode == 5:  # table + timer.  Triton's rule is one, but mode 1 stays its own loop, written
            # from Triton's documentation, so that tests/test_slo.py checks two implementations request by request.
            # The table decides at each epoch (a busy-aware one at batch ends too); while it waits, the oldest
            # request's wait is bounded by ``delay``: then (mode 4) the largest allowed size ≤ n is served (pref
            # holds the allowed sizes; below the smallest, the n waiting are served padded to it), or (mode 5)
            # min(n, largest) requests padded up to the next allowed size: DynamicBatcher's forced batch with
            # short_batch "pad" or "pad-up"
            while True:
                if n == 0:
                    if nxt >= n_req:
                        break
                    tau = arr[nxt]
                    nxt += 1
                    n = 1
                    continue
                busy, end = 0, np.inf
                if rows > 1:
                    busy, end = _busy_now(tau, free, cont, run, rem, extra, slow, efac, lat_of, en_of, arr, resp,
                                          bounds, genergy, state)
                a = table[min(busy, rows - 1) * (top + 1) + min(n, top)]
                if a > 0:
                    size = a
                    start = tau
                    break
                deadline = arr[head] + delay
                if deadline > tau and nxt < n_req and arr[nxt] < deadline and arr[nxt] <= end:
                    tau = arr[nxt]
                    nxt += 1
                    n += 1
                    continue
                if end < deadline and end > tau:  # a batch ends first: k falls, the table decides again
                    tau = end
                    continue
                if deadline == np.inf:  # a pure table: no more arrivals, it waits for ever
                    break
                if deadline > tau:
                    tau = deadline
                p = 0
                for q in pref:
                    if (q <= n or mode == 5) and q > p:
                        p = q
                size = p if p > 0 and p <= n else n
                start = tau
                state[7] += head < bounds[-1]
                break
        else:  # 3: TorchServe: when the worker is free, take the first request, then wait up to the delay for B
            if n == 0:
                if nxt >= n_req:
                    break
                tau = arr[nxt]
                nxt += 1
                n = 1
            if n >= maxb:
                size = maxb
                start = tau
            else:
                deadline = tau + delay
                start = deadline
                while nxt < n_req and arr[nxt] <= deadline:
                    n += 1
                    nxt += 1
                    if n == maxb:
                        start = arr[nxt - 1]
                        break
                if n < maxb:
                    state[7] += head < bounds[-1]
                size = min(n, maxb)
            tau = start
        if size == 0:
            state[0] = head
            state[1] = nxt
            state[2] = tau
            return -1
        if cont:
            _advance(start, run, rem, extra, slow, efac, lat_of, en_of, arr, resp, bounds, genergy, state)
            k = 0
            while run[k, 1] > 0:
                k += 1
            s_exec = pad[size]
            run[k, 0] = head
            run[k, 1] = size
            run[k, 2] = s_exec
            rem[k] = _duration(s_exec, lat_of, det, pool_of, unit, ptr)
            sizes_hist[s_exec] += 1
            qhist[min(nxt - head, qhist.size - 1)] += 1
        else:
            free[k], grp = _serve(arr, head, nxt, size, start, pad, lat_of, en_of, det, pool_of, unit, ptr, resp,
                                  bounds, genergy, sizes_hist, qhist, grp)
        last = start
        batches += 1
        head += size
    state[0] = head
    state[1] = nxt
    state[2] = last
    state[3] = grp
    return batches


@njit(cache=True)
def _matmul_into(A, B, out):
    m = A.shape[0]
    for i in range(m):
        for j in range(m):
            acc = 0.0
            for k in range(m):
                acc += A[i, k] * B[k, j]
            out[i, j] = acc


@njit(cache=True)
def _expm(D0, t):
    """The runtime's :func:`~smdp_batch.runtime.phase.expm_direction` with explicit loops and no temporaries
    (the same uniformization, scaling and squaring; tested equal to 1e-12): ~50× faster on 2 × 2 matrices."""
    m = D0.shape[0]
    E = np.eye(m)
    q = 0.0
    for i in range(m):
        if -D0[i, i] > q:
            q = -D0[i, i]
    if q <= 0.0 or t <= 0.0:
        return E
    s = 0
    # the runtime's horizon (QT_HORIZON = 2⁶⁰): past it the direction has converged, and the loop stays bounded
    x = q * t if t < 1152921504606846976.0 / q else 1152921504606846976.0
    while x > 0.5 and s < 64:
        x *= 0.5
        s += 1
    P = np.empty((m, m))
    for i in range(m):
        for j in range(m):
            v = (1.0 if i == j else 0.0) + D0[i, j] / q
            P[i, j] = v if v > 0.0 else 0.0
    term = np.eye(m)
    tmp = np.empty((m, m))
    for n in range(1, 30):
        _matmul_into(term, P, tmp)
        tmax = 0.0
        emax = 0.0
        for i in range(m):
            for j in range(m):
                term[i, j] = tmp[i, j] * (x / n)
                E[i, j] += term[i, j]
                tmax = max(tmax, term[i, j])
                emax = max(emax, E[i, j])
        if tmax < 1e-17 * emax:
            break
    for _ in range(s):
        _matmul_into(E, E, tmp)
        mx = tmp.max()
        for i in range(m):
            for j in range(m):
                E[i, j] = tmp[i, j] / mx
    mx = E.max()
    for i in range(m):
        for j in range(m):
            E[i, j] /= mx
    return E


#: Context sources of :func:`_context_kernel`: a per-arrival context (the λ-bank's table index), the
#: true phase path, the filter's most likely phase, or the belief-weighted action values (Q_MDP).
CTX_ARRIVAL, CTX_PATH, CTX_LIKELY, CTX_QMDP = 0, 1, 2, 3


@njit(cache=True)
def phase_beliefs(arr, D0, D1, pi):
    """Filter beliefs (N + 1, m): row 0 the stationary law at t = 0, row k + 1 just after arrival k
    (:mod:`smdp_batch.runtime.phase`)."""
    n = arr.size
    m = D0.shape[0]
    out = np.empty((n + 1, m))
    out[0] = pi
    a = pi.copy()
    for k in range(n):
        if k == 0:
            v = a @ D1
        else:
            v = a @ _expm(D0, arr[k] - arr[k - 1]) @ D1
        s = v.sum()
        if not s > 0.0:
            v = np.ones(m) @ D1
            s = v.sum()
        a = v / s
        out[k + 1] = a
    return out


@njit(cache=True)
def _context_action(n, tau, nxt, arr, ctx_mode, tables, top, ctx_arr, init_ctx, sw_t, sw_p, sw_ptr, alpha, D0, qv,
                    actions):
    """The batch size at an epoch τ with n queued and arrivals 0..nxt−1 seen; (action, new sw_ptr)."""
    row = n if n < top else top
    if row < 0 or row >= tables.shape[1]:
        raise IndexError("context table: queue row outside the table")
    if ctx_mode == 0:
        if nxt > ctx_arr.size:
            raise IndexError("context table: fewer contexts than arrivals")
        c = ctx_arr[nxt - 1] if nxt > 0 else init_ctx
        if c < 0 or c >= tables.shape[0]:
            raise IndexError("context table: context index outside the tables")
        return tables[c, row], sw_ptr
    if ctx_mode == 1:
        while sw_ptr + 1 < sw_t.size and sw_t[sw_ptr + 1] <= tau:
            sw_ptr += 1
        if sw_ptr >= sw_p.size or sw_t.size != sw_p.size:
            raise IndexError("phase table: the phase path is empty or its arrays differ in length")
        c = sw_p[sw_ptr]
        if c < 0 or c >= tables.shape[0]:
            raise IndexError("phase table: the stream's phase is outside the table's phases")
        return tables[c, row], sw_ptr
    if D0.shape[0] != tables.shape[0] or nxt >= alpha.shape[0] or alpha.shape[1] != D0.shape[0]:
        raise IndexError("phase table: the filter's phases do not match the table's")
    t_ref = arr[nxt - 1] if nxt > 0 else 0.0
    beta = alpha[nxt] @ _expm(D0, tau - t_ref)
    if ctx_mode == 3 and n < qv.shape[0]:
        if qv.shape[1] != beta.size or qv.shape[2] < actions.size:
            raise IndexError("phase table: action values do not match the phases or actions")
        best = np.inf
        at = 0
        for ai in range(actions.size):  # Σ_i β_i Q((n, i), a) over the feasible actions (a ≤ n)
            if actions[ai] > n:
                break
            q = 0.0
            for i in range(beta.size):
                q += beta[i] * qv[n, i, ai]
            if q < best:
                best = q
                at = ai
        return actions[at], sw_ptr
    return tables[np.argmax(beta), row], sw_ptr


@njit(cache=True, nogil=True)  # the SLO search runs rule families on threads
def _context_kernel(arr, ctx_mode, tables, top, ctx_arr, init_ctx, sw_t, sw_p, alpha, D0, qv, actions, pad, lat_of,
                    en_of, det, pool_of, unit, ptr, resp, bounds, genergy, sizes_hist, qhist, state, stop):
    """:func:`_kernel`'s table mode with a table chosen by context (see CTX_*); state[4] is the phase-path pointer."""
    n_req = arr.size
    head = int(state[0])
    nxt = int(state[1])
    tau = state[2]
    grp = int(state[3])
    sw_ptr = int(state[4])
    batches = 0
    while head < stop:
        while nxt < n_req and arr[nxt] <= tau:
            nxt += 1
        n = nxt - head
        size = 0
        while True:
            a, sw_ptr = _context_action(n, tau, nxt, arr, ctx_mode, tables, top, ctx_arr, init_ctx, sw_t, sw_p, sw_ptr,
                                        alpha, D0, qv, actions)
            if a > 0:
                size = a
                break
            if nxt >= n_req:
                break
            tau = arr[nxt]
            nxt += 1
            n += 1
        if size == 0:
            state[0] = head
            state[1] = nxt
            state[2] = tau
            state[4] = sw_ptr
            return -1
        tau, grp = _serve(arr, head, nxt, size, tau, pad, lat_of, en_of, det, pool_of, unit, ptr, resp, bounds,
                          genergy, sizes_hist, qhist, grp)
        batches += 1
        head += size
    state[0] = head
    state[1] = nxt
    state[2] = tau
    state[3] = grp
    state[4] = sw_ptr
    return batches
