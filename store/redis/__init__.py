"""Redis's store, cut by role: store.memory.Memory composes the mixins defined here. base.py
holds what every role shares (RedisBase: the client, the keys, the shared vector indexes and the
embedder they were built with, the helpers that stage a script and fence a decision); each other
module holds one role of store.base (graph.py two: GraphWrites and GraphReads; layers.py and
search.py share Layers), as a mixin over RedisBase, with the Lua scripts its methods run.
store/in_memory/ is cut the same way, file for file: a rule's in-process twin is in the module of
the same name there.

Nothing is imported here: each module imports the base (and a role it reads through), and
store.memory imports them all."""
