"""memstream workers: the faust app of the indexing agents (app.py), their envelope and stages,
the query side (a plain aiohttp server on Redis), model clients and pure algorithms."""
