"""Personalized PageRank over a cached sparse graph (pure: numpy/scipy, no I/O).

`SparseGraph` keeps the undirected weighted adjacency as a CSR matrix plus a buffer of edge
deltas; `matrix()` folds pending deltas in with one sparse addition — never a rebuild from
scratch per query or per document. `personalized_pagerank` is the power iteration of DESIGN §5:
x ← (1 − λ)·r + λ·(Pᵀx + dangling mass · r), P the row-normalised adjacency, λ = 0.5 (igraph's
"damping 0.5", HippoRAG's call), stopping when the L1 change is below the tolerance."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


class SparseGraph:
    def __init__(self):
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self._csr = sp.csr_matrix((0, 0), dtype=np.float64)
        self._weights: dict[tuple[int, int], float] = {}  # current weight of every edge (i < j)
        self._delta_rows: list[int] = []
        self._delta_cols: list[int] = []
        self._delta_vals: list[float] = []
        self.rebuilds = 0  # full constructions of the matrix (tests assert deltas are used)

    def node(self, name: str) -> int:
        found = self.index.get(name)
        if found is None:
            found = self.index[name] = len(self.names)
            self.names.append(name)
        return found

    def set_edge(self, a: str, b: str, weight: float) -> None:
        """Set the undirected edge a–b to `weight` (0 removes it)."""
        i, j = self.node(a), self.node(b)
        if i == j:
            return
        key = (min(i, j), max(i, j))
        change = weight - self._weights.get(key, 0.0)
        if change == 0:
            return
        if weight:
            self._weights[key] = weight
        else:
            self._weights.pop(key, None)
        self._delta_rows += [i, j]
        self._delta_cols += [j, i]
        self._delta_vals += [change, change]

    @property
    def edges(self) -> int:
        return len(self._weights)

    def matrix(self) -> sp.csr_matrix:
        """The symmetric adjacency with every delta applied (grown to the current node count)."""
        n = len(self.names)
        if self._csr.shape[0] != n:
            self._csr.resize((n, n))
        if self._delta_vals:
            delta = sp.csr_matrix((self._delta_vals, (self._delta_rows, self._delta_cols)), shape=(n, n))
            self._csr = (self._csr + delta).tocsr()
            self._csr.eliminate_zeros()
            self._delta_rows, self._delta_cols, self._delta_vals = [], [], []
        return self._csr

    @classmethod
    def from_edges(cls, edges) -> "SparseGraph":
        graph = cls()
        for a, b, w in edges:
            graph.set_edge(a, b, w)
        graph.rebuilds += 1
        return graph


def personalized_pagerank(adjacency: sp.csr_matrix, reset: np.ndarray, damping: float = 0.5, tol: float = 1e-6, max_iter: int = 100) -> np.ndarray:
    """Stationary distribution of a walk that follows weighted edges with probability
    `damping` and jumps to the reset distribution otherwise (dangling mass jumps too)."""
    total = float(reset.sum())
    if total <= 0:
        raise ValueError("the reset vector needs positive mass")
    r = reset / total
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    dangling = degree == 0
    inverse = np.divide(1.0, degree, out=np.zeros_like(degree), where=~dangling)
    transposed = adjacency.T.tocsr()
    x = r.copy()
    for _ in range(max_iter):
        spread = transposed @ (x * inverse)
        nxt = (1 - damping) * r + damping * (spread + x[dangling].sum() * r)
        if np.abs(nxt - x).sum() < tol:
            return nxt
        x = nxt
    return x
