"""The PPR iteration of one graph version (pure: numpy/scipy, no I/O): x = (1 − λ)·r + λ·(Pᵀx +
dangling mass · r), P the row-normalised adjacency, solved by Chebyshev semi-iteration to a
guaranteed L1 error below the tolerance (`_chebyshev`), in at most MAX_PASSES matrix passes: one
query's work is bounded whatever its damping and tolerance.

`Transition` iterates over the whole matrix (float32, hubs first, column-normalised);
`LeafEliminated` over the core alone, the leaves (nodes joined only to the core) computed once
at the end. Both return a `PPR`. A large matrix's pass runs in row blocks on threads
(PARALLEL_ENTRIES). `workers.algorithms.ppr.SparseGraph.transition()` makes and caches them."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

# Hard cap on matrix passes per PPR. The query worker's bounds (damping ≤ 0.95, tolerance ≥
# 1e-9) need about 65 passes (205 with the 3× margin of the default cap); damping 0.999999 at
# tolerance 1e-12 would need ~20,000 (58,000 allowed by the margin) on the event loop.
MAX_PASSES = 256


@dataclass(frozen=True)
class PPR:
    """A PPR solve: the scores and how far the iteration got."""

    scores: np.ndarray  # the graph's nodes in node-id order, then the `outside` nodes
    passes: int  # matrix passes made
    error_bound: float  # guaranteed L1 distance of `scores` from the exact PPR vector (at most 2)
    converged: bool  # error_bound ≤ the tolerance asked for; False: stopped at the pass cap


class Transition:
    """The iteration matrix of one graph version: M = λ·A·D⁻¹ in float32, nodes ordered by
    neighbour count, most first — the hubs' entries of x, which most rows read, stay in cache,
    and isolated (dangling) nodes come last. A is symmetric, so A·D⁻¹·x = Pᵀx with P = D⁻¹·A.

    `product` sums rows in float32 but cuts rows longer than CHUNK into pieces whose sums are
    added in float64: hub rows (up to 35,000 entries at 10⁶ edges) summed whole in float32 add
    about 2·10⁻⁷ of L1 error to every step, enough to miss a 10⁻⁶ tolerance."""

    CHUNK = 128

    def __init__(self, adjacency: sp.csr_matrix, degree: np.ndarray):
        n = adjacency.shape[0]
        self.order = np.argsort(-np.diff(adjacency.indptr), kind="stable")
        self.position = np.empty_like(self.order)  # node id → place in `order`
        self.position[self.order] = np.arange(n)
        degree = degree[self.order]
        self.dangling = int((degree == 0).sum())  # the last positions
        inverse = np.divide(1.0, degree, out=np.zeros(n), where=degree > 0)
        matrix = (adjacency[self.order][:, self.order] @ sp.diags(inverse)).astype(np.float32).tocsr()
        matrix.sort_indices()
        self.matrix, self.damping = matrix, 1.0  # `matrix` holds damping × A·D⁻¹
        self.degree, self.inverse = degree.astype(np.float32), inverse.astype(np.float32)
        bounds = matrix.indptr
        self.long_rows = int((np.diff(bounds) > self.CHUNK).sum())  # a prefix: rows are in length order
        pieces = [np.arange(bounds[i], bounds[i + 1], self.CHUNK) for i in range(self.long_rows)]
        self.piece_starts = np.cumsum([0] + [len(p) for p in pieces])  # first piece of each long row
        split_bounds = np.concatenate(pieces + [bounds[self.long_rows :]]).astype(bounds.dtype)
        self.split = sp.csr_matrix(
            (matrix.data, matrix.indices, split_bounds), shape=(len(split_bounds) - 1, n), copy=False
        )
        self.blocks = _row_blocks(self.split, product_threads() if matrix.nnz >= PARALLEL_ENTRIES else 1)

    def solve(
        self,
        reset: np.ndarray,
        damping: float = 0.5,
        tol: float = 1e-6,
        max_iter: int | None = None,
        outside: np.ndarray | None = None,
    ) -> PPR:
        """PPR over this graph version (`SparseGraph.solve`). Reads nothing but this object, so it
        may run on another thread while the graph takes new deltas — but one solve at a time:
        `scale` rescales the shared matrix in place."""
        reset, outside = _checked(reset, damping, tol, outside)
        self.scale(damping)
        nonzero = np.flatnonzero(reset)
        ordered, isolated, passes, bound = _chebyshev(
            self, self.position[nonzero], reset[nonzero], tol, max_iter, outside
        )
        return PPR(np.concatenate([ordered[self.position], isolated]), passes, bound, bound <= tol)

    def scale(self, damping: float) -> None:
        if damping != self.damping:
            self.matrix.data *= np.float32(damping / self.damping)  # `split` shares the array
            self.damping = damping

    def product(self, x: np.ndarray) -> np.ndarray:
        """M·x, one pass over the matrix."""
        pieces = int(self.piece_starts[-1])
        z = _product(self.blocks, x)  # scipy's product releases the GIL: blocks on threads at once
        y = z[pieces - self.long_rows :]
        if self.long_rows:
            y[: self.long_rows] = np.add.reduceat(z[:pieces], self.piece_starts[:-1], dtype=np.float64)
        return y

    def seed_product(self, seeds: np.ndarray, values: np.ndarray, dtype) -> np.ndarray:
        """M·v for v nonzero only at `seeds`, read from the seeds' rows instead of the whole
        matrix (A symmetric): (M·v)_k = d_k · Σ_j M_jk · v_j / d_j."""
        out = np.zeros(self.matrix.shape[0], dtype=dtype)
        for j, v in zip(seeds.tolist(), values.tolist()):
            start, end = self.matrix.indptr[j], self.matrix.indptr[j + 1]
            columns = self.matrix.indices[start:end]
            out[columns] += self.matrix.data[start:end] * self.degree[columns] * (v * self.inverse[j])
        return out


# A pass over a large matrix is split in row blocks of about equal entries, one per core (at
# most four), computed at once. Measured on this 2-core machine, interleaved: the 200,000-passage
# tenant of `bench scale` (1.8 million entries) 1.62 → 0.86 ms a pass, its solve 22.7 → 15.1 ms
# p50; a million entries, solve 0.79×; half a million, 1.13× — the hand-off (~150 µs a pass,
# thread wake-ups) outweighs the split below about a million entries, so one thread does those.
PARALLEL_ENTRIES = 1_000_000
MAX_PRODUCT_THREADS = 4


def product_threads() -> int:
    return max(1, min(MAX_PRODUCT_THREADS, len(os.sched_getaffinity(0))))


_POOL: ThreadPoolExecutor | None = None


def _product_pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=MAX_PRODUCT_THREADS - 1, thread_name_prefix="memstream-ppr-product")
    return _POOL


def _row_blocks(matrix: sp.csr_matrix, parts: int) -> list[sp.csr_matrix]:
    """`matrix`'s rows in `parts` consecutive blocks of about equal entries, each a view on its
    arrays (no copy: `Transition.scale` rescales them all in place)."""
    if parts <= 1 or matrix.shape[0] < parts:
        return [matrix]
    indptr = matrix.indptr
    cuts = np.searchsorted(indptr, np.linspace(0, matrix.nnz, parts + 1)[1:-1])
    rows = sorted({0, *cuts.tolist(), matrix.shape[0]})
    blocks = []
    for start, end in zip(rows, rows[1:]):
        first, last = indptr[start], indptr[end]
        data, indices = matrix.data[first:last], matrix.indices[first:last]
        block = sp.csr_matrix((data, indices, indptr[start : end + 1] - first), shape=(end - start, matrix.shape[1]))
        block.data, block.indices = data, indices  # scipy copies a view of a much larger array ("prune")
        blocks.append(block)
    return blocks


FLOAT32_TOLERANCE = 1e-6  # below this L1 tolerance the vectors are float64 (float32 rounding floor ≈ 10⁻⁷)


def _chebyshev(
    transition: Transition,
    seeds: np.ndarray,
    weights: np.ndarray,
    tol: float,
    max_iter: int | None,
    outside: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """PPR with restart 1 − λ and dangling mass back to the reset vector r (`weights` at the
    positions `seeds`, `outside` on isolated nodes beyond the matrix; normalised here), to L1
    error ≤ tol or for at most min(max_iter, MAX_PASSES) passes: (scores in the transition's
    node order, scores of the outside nodes, passes made, L1 error bound).

    Solves y = M·y + r with the dangling columns of M empty; then x = κ·y with
    κ = (1 − λ)/(1 − λ·(y's mass on dangling nodes)) — isolated nodes keep exactly their reset
    mass, so κ is known up front. M's eigenvalues are real, in [−λ, λ] (A·D⁻¹ is similar to the
    symmetric D^-½·A·D^-½), so Chebyshev semi-iteration converges at rate
    λ/(1 + √(1 − λ²)) — 0.27 per step at λ = 0.5, against 0.5 for the power iteration: 13 matrix
    passes (the first read from the seeds' rows only) instead of 20 for 10⁻⁶ at 10⁶ edges. It stops on the residual ρ = M·y + r − y, which bounds the
    error of the returned κ·(M·y + r) by κ·λ·‖ρ‖₁/(1 − λ) — a guarantee, where the power
    iteration's "L1 change below tol" is not."""
    total = float(weights.sum() + outside.sum())
    damping = transition.damping
    dtype = np.float32 if tol >= FLOAT32_TOLERANCE else np.float64
    n = transition.matrix.shape[0]
    teleport = (weights / total).astype(dtype)
    isolated_mass = float(teleport[seeds >= n - transition.dangling].sum(dtype=np.float64) + outside.sum() / total)
    kappa = (1 - damping) / (1 - damping * isolated_mass)
    isolated = kappa * outside / total
    if not len(seeds):
        return np.zeros(n), isolated, 0, 0.0
    r = np.zeros(n, dtype=dtype)
    r[seeds] = teleport
    error_per_residual = kappa * damping / (1 - damping)
    expected_steps = _expected_steps(damping, tol)
    first_check = max(1, expected_steps - 4)  # no residual pass while it cannot be small yet
    max_iter = max(1, min(max_iter or 3 * expected_steps + 10, MAX_PASSES))
    previous, y = np.zeros_like(r), r
    residual = np.empty_like(r)
    omega = 1.0
    for step in range(1, max_iter + 1):
        q = transition.seed_product(seeds, teleport, dtype) if step == 1 else transition.product(y)
        q[seeds] += teleport
        if step >= first_check or step == max_iter:
            np.subtract(q, y, out=residual)
            np.abs(residual, out=residual)
            bound = error_per_residual * float(residual.sum(dtype=np.float64))
            if bound <= tol or step == max_iter:  # at the cap: the estimate so far, and how good it is
                q *= dtype(kappa)
                return q, isolated, step, min(bound, 2.0)
        omega = _omega(step, damping, omega)
        q -= previous  # y ← ω·(M·y + r − y_prev) + y_prev
        q *= dtype(omega)
        q += previous
        previous, y = y, q
    raise AssertionError("unreachable: the last pass returns")


# The two-hop product's terms (Σ over leaves of their degree squared, before equal pairs merge)
# past which S is not even made: bench scale's tenants have 1.59× (50,000 passages) and 1.72×
# (200,000) their matrix's entries, S then 0.49× and 0.35× of them; HotpotQA-100's graph (8.8
# entities a passage) and `bench graph`'s Zipf tenant ~3.1×, where S came out larger than the
# matrix — made and dropped on every graph version: measured on 200,000 passages of 9 entities
# each (4.5×), S 3.9× the matrix, 0.99 s and 190 MB at its peak.
TWO_HOP_TERMS = 2.0


class LeafEliminated:
    """The PPR of `Transition`, solved with the leaves eliminated: nodes joined only to the
    other nodes ("core": a tenant's entities; leaves: its passages and types). With M = λ·A·D⁻¹
    split by that cut, M's leaf–leaf block is empty, so y = M·y + r becomes

        y_core = S·y_core + c,  S = M_cc + M_cl·M_lc,  c = r_core + M_cl·r_leaf
        y_leaf = M_lc·y_core + r_leaf

    — an iteration over the core alone (15k of the 215k nodes of `bench scale`'s 200,000-passage
    tenant, and S 0.64 M entries where A has 1.83 M: co-mentions are few), the leaves computed
    once at the end. S = λ·A_cc·D_c⁻¹ + λ²·A_cl·D_l⁻¹·A_lc·D_c⁻¹ is similar to a symmetric matrix,
    its eigenvalues in [−λ·h, λ² + (λ − λ²)·h] with h the largest share of a core node's
    weight on other core nodes (the first term's column sums bound it, the second is positive
    semidefinite; S's column sums bound the top), so Chebyshev semi-iteration converges faster
    than over M's [−λ, λ]: 10 passes over S for 13 over M at h = 2/3. Measured (that tenant's
    graph, 15 seed sets, interleaved): solve p50 37.4 → 12.0 ms; the 50,000-passage tenant's,
    with the seeds of 32 real queries: 7.2 → 5.1 ms, every top 10 the same, L1 distance between
    the two ≤ 4.6·10⁻⁷; ppr over HTTP at 200,000 passages 52.4 → 35.5 ms p50 (`bench scale`).
    The error bound is the same guarantee as `Transition`'s: the whole system's residual is the
    core's (the leaves' is zero by construction). Float64 throughout: a hub's row of S is long,
    and the vectors are the core's."""

    def __init__(self, core: np.ndarray, leaves: np.ndarray, a_cc: sp.csr_matrix, w: sp.csr_matrix, degree: np.ndarray):
        self.core, self.leaf_nodes, self.n = core, leaves, len(core) + len(leaves)
        self.degree_core, self.degree_leaf = degree[core], degree[leaves]
        self.inverse_leaf = _inverse(self.degree_leaf)
        self.isolated = np.flatnonzero(degree == 0)
        self.a_cc_scaled = (a_cc @ sp.diags(_inverse(self.degree_core))).tocsr()  # A_cc·D_c⁻¹
        self.w = w  # A_lc·D_c⁻¹ (leaf rows): M_lc = λ·w
        share = np.asarray(a_cc.sum(axis=1)).ravel() * _inverse(self.degree_core)
        self.core_share = float(share.max()) if len(share) else 0.0  # h
        self._s: tuple[float, list[sp.csr_matrix]] | None = None  # (λ, S's row blocks)
        self._two_hops: sp.csr_matrix | None = self.two_hops()  # until S is made from it

    def two_hops(self) -> sp.csr_matrix:
        """A_cl·D_l⁻¹·A_lc·D_c⁻¹: a core node to a core node through a leaf."""
        return (sp.diags(self.degree_core) @ self.w.T @ sp.diags(self.inverse_leaf) @ self.w).tocsr()

    @classmethod
    def of(cls, adjacency: sp.csr_matrix, degree: np.ndarray, leaves: np.ndarray) -> "LeafEliminated | None":
        """The elimination of the nodes `leaves` marks, or None where it does not apply: no
        leaf, two leaves joined, or an S with more entries than the matrix (hubs co-mentioned
        with everything), which would make a pass dearer than one over the whole graph."""
        leaf_nodes, core = np.flatnonzero(leaves), np.flatnonzero(~leaves)
        if not len(leaf_nodes) or not len(core):
            return None
        a_lc = adjacency[leaf_nodes]
        if a_lc[:, leaf_nodes].nnz:
            return None
        a_lc = a_lc[:, core].tocsr()
        mentions = np.diff(a_lc.indptr).astype(np.int64)
        if int((mentions**2).sum()) > TWO_HOP_TERMS * adjacency.nnz:
            return None  # S's product alone would cost more than it can save (and its memory)
        w = (a_lc @ sp.diags(_inverse(degree[core]))).tocsr()
        reduced = cls(core, leaf_nodes, adjacency[core][:, core].tocsr(), w, degree)
        two_hops = reduced._two_hops
        return reduced if two_hops is not None and two_hops.nnz + reduced.a_cc_scaled.nnz <= adjacency.nnz else None

    def _iteration(self, damping: float) -> list[sp.csr_matrix]:
        """S for this damping, in row blocks (`_row_blocks`), made once per damping (the two-hop
        part is not kept beside it: a damping other than the last, rare, makes it again). A new
        S replaces the old whole, so a solve under way keeps the one it read."""
        held = self._s
        if held is None or held[0] != damping:
            two_hops = self._two_hops if self._two_hops is not None else self.two_hops()
            self._two_hops = None
            s = (damping * self.a_cc_scaled + damping * damping * two_hops).tocsr()
            s.sort_indices()
            held = self._s = (damping, _row_blocks(s, product_threads() if s.nnz >= PARALLEL_ENTRIES else 1))
        return held[1]

    def solve(
        self,
        reset: np.ndarray,
        damping: float = 0.5,
        tol: float = 1e-6,
        max_iter: int | None = None,
        outside: np.ndarray | None = None,
    ) -> PPR:
        """As `Transition.solve` (the same equation, bound and pass cap; passes over S)."""
        reset, outside = _checked(reset, damping, tol, outside)
        total = float(reset.sum() + outside.sum())
        r = reset / total
        kappa = (1 - damping) / (1 - damping * float(r[self.isolated].sum() + outside.sum() / total))
        isolated = kappa * outside / total
        scores = np.empty(self.n)
        r_leaf = r[self.leaf_nodes]
        seeded = np.flatnonzero(r_leaf)
        if not len(seeded) and not r[self.core].any():
            return PPR(np.concatenate([np.zeros(self.n), isolated]), 0, 0.0, True)
        blocks = self._iteration(damping)
        # c = r_core + λ·A_cl·D_l⁻¹·r_leaf, from the seeded leaves' rows (A symmetric)
        c = (
            r[self.core]
            + damping * (self.w[seeded].T @ (r_leaf[seeded] * self.inverse_leaf[seeded])) * self.degree_core
        )
        low, high = -damping * self.core_share, damping**2 + (damping - damping**2) * self.core_share
        gamma = 2 / (2 - low - high)  # y ← γ·(S·y + c) + (1 − γ)·y has its spectrum in [−ρ, ρ]
        rho = gamma * (high - low) / 2
        error_per_residual = kappa * damping / (1 - damping)
        cap = max(1, min(max_iter or 3 * _expected_steps(rho, tol) + 10, MAX_PASSES))
        previous, y, omega = np.zeros_like(c), c, 1.0
        for step in range(1, cap + 1):
            q = _product(blocks, y) + c
            bound = error_per_residual * float(np.abs(q - y).sum())
            if bound <= tol or step == cap:  # q = (M·y + r) on the core; the leaves' follow from y
                scores[self.core] = q
                scores[self.leaf_nodes] = damping * (self.w @ y) + r_leaf
                return PPR(np.concatenate([kappa * scores, isolated]), step, min(bound, 2.0), bound <= tol)
            omega = _omega(step, rho, omega)
            q = omega * (gamma * q + (1 - gamma) * y - previous) + previous
            previous, y = y, q
        raise AssertionError("unreachable: the last pass returns")


def _checked(reset, damping: float, tol: float, outside) -> tuple[np.ndarray, np.ndarray]:
    """A solve's reset and outside weights as float64 arrays, its inputs checked."""
    if not 0 < damping < 1 or not tol > 0:
        raise ValueError(f"PPR needs damping in (0, 1) and a positive tolerance, not {damping!r} and {tol!r}")
    reset = np.asarray(reset, dtype=np.float64)
    outside = np.zeros(0) if outside is None else np.asarray(outside, dtype=np.float64)
    if not reset.sum() + outside.sum() > 0 or (reset < 0).any() or (outside < 0).any():
        raise ValueError("the reset vector needs positive mass and no negative entry")
    return reset, outside


def _inverse(values: np.ndarray) -> np.ndarray:
    return np.divide(1.0, values, out=np.zeros(len(values)), where=values > 0)


def _product(blocks: list[sp.csr_matrix], x: np.ndarray) -> np.ndarray:
    """The row blocks' products with x, the blocks after the first on the pool's threads (one
    block: the product itself, on this thread)."""
    if len(blocks) == 1:
        return blocks[0] @ x
    pool = _product_pool()
    rest = [pool.submit(block.__matmul__, x) for block in blocks[1:]]
    return np.concatenate([blocks[0] @ x, *(part.result() for part in rest)])


def _expected_steps(rho: float, tol: float) -> int:
    """Chebyshev steps to `tol` over a spectrum in [−ρ, ρ]: it converges at ρ/(1 + √(1 − ρ²))."""
    return int(np.log(tol) / np.log(rho / (1 + np.sqrt(1 - rho**2)))) + 1


def _omega(step: int, rho: float, previous: float) -> float:
    """The Chebyshev semi-iteration's weight at `step` for a spectrum in [−ρ, ρ]."""
    return 1 / (1 - rho**2 / 2) if step == 1 else 1 / (1 - rho**2 * previous / 4)
