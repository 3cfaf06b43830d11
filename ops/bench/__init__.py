"""The benchmarks, one module per `memstream bench` kind: `index` (and `index --rules`: `rules`),
`recall`, `ppr`, `load`, `conversation`, `memory_tax`, `wait`, `tenants`, `graph` and `scale`;
what several share in modules of their own: the QA sets (`datasets`), the corpora they index
(`corpora`) and the running of a script over a baseline checkout (`trees`).

The benches that measure two checkouts run their phase functions as scripts over the other
tree's packages (ops.bench.trees says how): at module level, and in those functions, such a
module imports only what both layouts of ops/ have."""
