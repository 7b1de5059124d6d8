"""Training: the train state, the jitted train step and the loop.

``train_state`` (the state, its optimizer and shardings), ``train`` (the
train step with gradient accumulation and the loop with evaluation,
checkpoints and divergence handling) and ``lowering`` (a config's steps
exported for TPU and CUDA without the hardware).
"""
