"""Training: the train state, the jitted train step and the loop.

``train_state`` (the state, its optimizer and shardings), ``train_step``
(the jitted train step with gradient accumulation and backpropagation
through segments), ``train`` (the loop with evaluation, checkpoints and
divergence handling) and ``lowering`` (a config's steps exported for TPU
and CUDA without the hardware).
"""
