"""What Mirage reads and writes: traces and their schema, the trace parsers of ``ingest``,
synthetic traces (``synth``), submit-prefix digests, ISO times and the step artifacts' names.
The lowest layer: it imports nothing else of :mod:`mirage_tasks`."""
