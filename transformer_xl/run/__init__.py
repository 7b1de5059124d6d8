"""A run's directory: its files, checkpoints, metrics and coordination.

``run_dir`` (``RunDir``: what the training loop restores and saves;
``restore_params``: the parameters readers use), ``param_shapes`` (the
parameters' shapes and shardings on a mesh, nothing allocated),
``workdir`` (the files of a --workdir, and the one way each is read and
written), ``lock`` (one training at a time per workdir), ``checkpointing``
(orbax checkpoints written, verified and restored), ``fingerprints`` (the
checksums that verify them), ``metrics`` (metrics.jsonl, TensorBoard, the
package's reports) and ``distributed`` (what several processes agree on).
"""
