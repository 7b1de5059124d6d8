"""A run's directory: its files, checkpoints, metrics and coordination.

``workdir`` (the files of a --workdir, the training lock, parameters of the
newest usable checkpoint), ``checkpointing`` (orbax checkpoints written,
verified and restored), ``fingerprints`` (the checksums that verify them),
``metrics`` (metrics.jsonl, TensorBoard, the package log) and
``distributed`` (what several processes agree on).
"""
