"""The TPU compiler, and XLA:GPU, on a machine without the accelerator.

``python -m transformer_xl.compile --config=configs/FILE.py[:PRESET]
[--topology=...]`` compiles a config's real steps for a named TPU slice
(libtpu's compile-only client, ``[tpu-compile]``) or for H100s (jax's CUDA
plugin, ``[gpu-compile]``), executes nothing, and reports per device:
memory and whether it fits (``fit``), FLOPs, bytes and collectives
counted in the compiled program (``hlo``), and the roofline ceiling of a
step's time.  ``chips`` holds the chips' published numbers and the
topology names, ``compiler`` the devices and the compilation, ``flops``
the model FLOPs of MFU, ``report`` the command's output.  Nothing here is
imported by training or inference.
"""
