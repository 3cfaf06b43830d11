"""The indexing stages, one module each (chunker, extractor, detector, resolver), each a class
built from one StageContext (context.py) whose `handle` runs a message through the envelope
(workers.envelope); workers.pipeline wires them to their topics."""
