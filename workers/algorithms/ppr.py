"""Personalized PageRank over a cached sparse graph (pure: numpy/scipy, no I/O).

`SparseGraph` keeps the undirected weighted adjacency as a CSR matrix, its degree vector and a
buffer of edge deltas. An edge may carry several kinds (fact, passage, type, similar); the
matrix holds their sum. `transition()` folds pending deltas in with one sparse addition and
derives the `Transition` the iteration uses — float32, hubs first, column-normalised — cached
until the next delta: never a rebuild from the edges per query or per document. Node capacity
grows by doubling, so new nodes rarely resize the matrix.

`SparseGraph.pagerank` is the PPR of docs/architecture.md §5, x = (1 − λ)·r + λ·(Pᵀx + dangling mass · r),
P the row-normalised adjacency, λ = 0.5 (igraph's "damping 0.5", HippoRAG's call), solved by
Chebyshev semi-iteration to a guaranteed L1 error below the tolerance, in at most MAX_PASSES
matrix passes (the iteration: workers.algorithms.ppr_solver): one query's work is bounded
whatever its damping and tolerance. `personalized_pagerank` solves the same equation exactly,
for tests."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from workers.algorithms.ppr_solver import PPR, LeafEliminated, Transition


def _pair_key(i: int, j: int) -> int:
    """One int for the unordered node pair: smaller index in the high 32 bits."""
    return (i << 32 | j) if i < j else (j << 32 | i)


class KindWeights:
    """The weights of one kind of edge, by pair key (`_pair_key`): sorted int64 keys and float64
    weights — 16 bytes an edge, where a dict of tuples took ~200 — and the changes since they
    were last merged in (`pending`, 0: removed), merged once they are an eighth of the edges."""

    __slots__ = ("keys", "weights", "pending")

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.weights = np.zeros(0)
        self.pending: dict[int, float] = {}

    def get(self, key: int) -> float:
        found = self.pending.get(key)
        if found is not None:
            return found
        at = int(np.searchsorted(self.keys, key))
        return float(self.weights[at]) if at < len(self.keys) and self.keys[at] == key else 0.0

    def set(self, key: int, weight: float) -> None:
        self.pending[key] = weight
        if len(self.pending) > 4096 + len(self.keys) // 8:
            self.merge()

    def add_new(self, keys: np.ndarray, weights: np.ndarray) -> None:
        """Keys not held yet, each once, with nonzero weights."""
        self.merge()
        keys = np.concatenate([self.keys, keys])
        order = np.argsort(keys, kind="stable")
        self.keys, self.weights = keys[order], np.concatenate([self.weights, weights])[order]

    def merge(self) -> None:
        if not self.pending:
            return
        count = len(self.pending)
        keys = np.concatenate([self.keys, np.fromiter(self.pending.keys(), np.int64, count)])
        weights = np.concatenate([self.weights, np.fromiter(self.pending.values(), np.float64, count)])
        self.pending = {}
        order = np.argsort(keys, kind="stable")  # a pending change after the weight it replaces
        keys, weights = keys[order], weights[order]
        last = np.ones(len(keys), dtype=bool)
        last[:-1] = keys[1:] != keys[:-1]
        keep = last & (weights != 0)
        self.keys, self.weights = keys[keep], weights[keep]

    def all_keys(self) -> np.ndarray:
        self.merge()
        return self.keys

    def items(self):
        self.merge()
        return zip(self.keys.tolist(), self.weights.tolist())

    def __len__(self) -> int:
        self.merge()
        return len(self.keys)


class SparseGraph:
    """leaf_prefixes: names of nodes only ever joined to nodes without them (a tenant's passages
    and types, each joined to entities alone): `transition()` eliminates them from the
    iteration (`LeafEliminated`) — checked on every build, so an edge between two of them only
    costs the speed."""

    def __init__(self, capacity: int = 1024, leaf_prefixes: tuple[str, ...] = ()):
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.leaf_prefixes = leaf_prefixes
        self._leaves = np.zeros(0, dtype=bool)  # node id → named as a leaf; names only append
        self._capacity = capacity
        self._csr = sp.csr_matrix((capacity, capacity), dtype=np.float64)
        self._degree = np.zeros(capacity)
        self._kinds: dict[str, KindWeights] = {}  # current weight of every (i < j) edge, per kind
        self._pairs = 0  # node pairs with at least one edge
        self._delta_rows: list[int] = []
        self._delta_cols: list[int] = []
        self._delta_vals: list[float] = []
        self._delta_arrays: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # bulk deltas, before the lists
        self._transition: Transition | LeafEliminated | None = None
        self.rebuilds = 0  # full constructions of the matrix (tests assert deltas are used)
        self.deltas_applied = 0

    def __len__(self) -> int:
        return len(self.names)

    def node(self, name: str) -> int:
        found = self.index.get(name)
        if found is None:
            found = self.index[name] = len(self.names)
            self.names.append(name)
        return found

    def weight(self, a: str, b: str, kind: str) -> float:
        i, j = self.index.get(a), self.index.get(b)
        if i is None or j is None or kind not in self._kinds:
            return 0.0
        return self._kinds[kind].get(_pair_key(i, j))

    def set_edge(self, a: str, b: str, weight: float, kind: str = "") -> None:
        """Set the undirected edge a–b of one kind to `weight` (0 removes it)."""
        i, j = self.node(a), self.node(b)
        if i == j:
            return
        key = _pair_key(i, j)
        weights = self._kinds.get(kind)
        if weights is None:
            weights = self._kinds[kind] = KindWeights()
        before = weights.get(key)
        change = weight - before
        if change == 0:
            return
        if not before or not weight:  # the pair gains or loses this kind: maybe its first or last
            if not any(other.get(key) for name, other in self._kinds.items() if name != kind):
                self._pairs += 1 if weight else -1
        weights.set(key, weight)
        self._delta_rows += [i, j]
        self._delta_cols += [j, i]
        self._delta_vals += [change, change]

    def add_new_edges(
        self, kinds: list[str], codes: np.ndarray, first: np.ndarray, second: np.ndarray, weights: np.ndarray
    ) -> None:
        """Edges between node indexes at once (a load), edge k of kind kinds[codes[k]]: none of
        them in the graph yet, none twice among them, no weight 0. The same deltas, in the same
        order, as `set_edge` for each in turn."""
        if not len(first):
            return
        first, second = np.asarray(first, dtype=np.int64), np.asarray(second, dtype=np.int64)
        weights, codes = np.asarray(weights, dtype=np.float64), np.asarray(codes)
        keys = np.minimum(first, second) << 32 | np.maximum(first, second)
        held = [table.all_keys() for table in self._kinds.values()]
        for code, kind in enumerate(kinds):
            of_kind = codes == code
            if of_kind.any():
                self._kinds.setdefault(kind, KindWeights()).add_new(keys[of_kind], weights[of_kind])
        pairs = np.unique(keys)
        if held:
            pairs = pairs[~np.isin(pairs, np.concatenate(held))]
        self._pairs += len(pairs)
        self._flush_delta_lists()
        self._delta_arrays.append(
            (np.stack([first, second], 1).ravel(), np.stack([second, first], 1).ravel(), np.repeat(weights, 2))
        )

    def _flush_delta_lists(self) -> None:
        if self._delta_vals:
            self._delta_arrays.append(
                (
                    np.array(self._delta_rows, dtype=np.int64),
                    np.array(self._delta_cols, dtype=np.int64),
                    np.array(self._delta_vals, dtype=np.float64),
                )
            )
            self._delta_rows, self._delta_cols, self._delta_vals = [], [], []

    def edge_weights(self):
        """Every edge as (a, b, kind, weight), one row per kind on a node pair."""
        for kind, weights in self._kinds.items():
            for key, weight in weights.items():
                yield self.names[key >> 32], self.names[key & 0xFFFFFFFF], kind, weight

    @property
    def edges(self) -> int:
        """Node pairs joined by at least one edge."""
        return self._pairs

    def _fold(self) -> None:
        n = len(self.names)
        if n > self._capacity:
            while self._capacity < n:
                self._capacity *= 2
            self._csr.resize((self._capacity, self._capacity))
            self._degree = np.concatenate([self._degree, np.zeros(self._capacity - len(self._degree))])
        self._flush_delta_lists()
        if self._delta_arrays:
            shape = (self._capacity, self._capacity)
            if len(self._delta_arrays) == 1:
                rows, cols, vals = self._delta_arrays[0]
            else:
                rows, cols, vals = (np.concatenate(part) for part in zip(*self._delta_arrays))
            self._delta_arrays = []
            delta = sp.csr_matrix((vals, (rows, cols)), shape=shape)
            del cols
            self._csr = (self._csr + delta).tocsr() if self._csr.nnz else delta
            self._csr.eliminate_zeros()
            if self._degree.any():  # in order onto the degrees so far, as every fold before
                np.add.at(self._degree, rows, vals)
            else:  # the first fold (a load): the same sums, in the same order, at once
                self._degree = np.bincount(rows, weights=vals, minlength=self._capacity).astype(np.float64)
            self._degree[np.abs(self._degree) < 1e-12] = 0.0  # float residue of removed edges
            self.deltas_applied += len(vals) // 2
            self._transition = None

    def matrix(self) -> sp.csr_matrix:
        """The symmetric adjacency (n × n) with every delta applied."""
        self._fold()
        n = len(self.names)
        return self._csr[:n, :n]

    def neighbours(self, index: int) -> np.ndarray:
        """The indexes of the nodes joined to node `index` by any edge (deltas applied)."""
        self._fold()
        return self._csr.indices[self._csr.indptr[index] : self._csr.indptr[index + 1]]

    def degree(self) -> np.ndarray:
        self._fold()
        return self._degree[: len(self.names)]

    def transition(self) -> "Transition | LeafEliminated":
        """The iteration of the current graph, cached until the next delta: with the leaves
        eliminated where the graph has leaves and that makes the iteration smaller, else over
        the whole matrix."""
        self._fold()
        if self._transition is None:
            n = len(self.names)
            adjacency, degree = self._csr[:n, :n].tocsr(), self._degree[:n]
            reduced = LeafEliminated.of(adjacency, degree, self.leaves()) if self.leaf_prefixes else None
            self._transition = reduced or Transition(adjacency, degree)
        return self._transition

    def leaves(self) -> np.ndarray:
        """Whether each node's name has a leaf prefix (a boolean per node id)."""
        known = len(self._leaves)
        if known < len(self.names):
            prefixes = self.leaf_prefixes
            more = np.fromiter(
                (name.startswith(prefixes) for name in self.names[known:]), bool, len(self.names) - known
            )
            self._leaves = np.concatenate([self._leaves, more])
        return self._leaves

    def pagerank(
        self,
        reset: np.ndarray,
        damping: float = 0.5,
        tol: float = 1e-6,
        max_iter: int | None = None,
        outside: np.ndarray | None = None,
    ) -> np.ndarray:
        """PPR over the cached transition; `reset` has one entry per node. `outside`: reset
        weights of nodes not in the graph (a passage with no entity yet) — isolated, so each
        keeps its share of the restart mass; their scores follow the graph's nodes. Raises
        ArithmeticError when the tolerance is not reached within the pass cap (`solve` reports it)."""
        result = self.solve(reset, damping, tol, max_iter, outside)
        if not result.converged:
            raise ArithmeticError(
                f"PPR did not reach L1 tolerance {tol:g} in {result.passes} steps (error bound {result.error_bound:.3g})"
            )
        return result.scores

    def solve(
        self,
        reset: np.ndarray,
        damping: float = 0.5,
        tol: float = 1e-6,
        max_iter: int | None = None,
        outside: np.ndarray | None = None,
    ) -> PPR:
        """`pagerank` that stops at the pass cap with the best estimate and its error bound."""
        return self.transition().solve(reset, damping, tol, max_iter, outside)

    @classmethod
    def from_edges(cls, edges) -> "SparseGraph":
        """A graph built at once from (a, b, weight[, kind]) rows — a full rebuild."""
        graph = cls()
        for edge in edges:
            graph.set_edge(*edge)
        graph.rebuilds += 1
        return graph


def personalized_pagerank(adjacency: sp.csr_matrix, reset: np.ndarray, damping: float = 0.5) -> np.ndarray:
    """The exact PPR of a symmetric adjacency by a sparse direct solve — the reference the tests
    hold the cached iteration to (fill-in rules it out at scale):
    (I − λ·(T + r·dᵀ))·x = (1 − λ)·r, T = A·D⁻¹, d the dangling indicator."""
    from scipy.sparse.linalg import spsolve

    reset = np.asarray(reset, dtype=np.float64)
    if not reset.sum() > 0:
        raise ValueError("the reset vector needs positive mass")
    r = reset / reset.sum()
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    dangling = (degree == 0).astype(np.float64)
    inverse = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
    transition = sp.csc_matrix(adjacency @ sp.diags(inverse)) + sp.csc_matrix(r).T @ sp.csc_matrix(dangling)
    system = sp.identity(len(r), format="csc") - damping * transition
    return spsolve(system, (1 - damping) * r)
