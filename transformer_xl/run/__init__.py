"""A run's directory: its files, checkpoints, metrics and coordination.

``run_dir`` (``RunDir``: what the training loop restores and saves;
``restore_params``: the parameters readers use), ``param_shapes`` (the
parameters' shapes and shardings on a mesh, nothing allocated),
``workdir`` (the files of a --workdir, and the one way each is read and
written), ``lock`` (one training at a time per workdir), ``checkpointing``
(orbax checkpoints written, restored and verified), ``integrity`` (each
checkpoint's record of fingerprints, and its check), ``retention`` (which
checkpoints stay: rotation, set-aside, the record of the verified ones),
``fingerprints`` (the checksums that verify them), ``metrics`` (metric
names, metrics.jsonl, TensorBoard) and ``distributed`` (what several
processes agree on).  The package's reports and atomic writes are
``transformer_xl.util``'s.
"""
