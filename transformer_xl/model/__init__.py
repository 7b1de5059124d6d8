"""The model and only the model: the network, its memory and attention variants.

``models`` (``TransformerXL``, the layer stack), ``memory`` (the recurrent
memory's state, reset and update), ``attention`` and ``attention_ops`` (the
attention variants and what they share), ``pallas_attention`` (the fused
kernel), ``adaptive`` (adaptive input and softmax), ``tuning`` (remat,
attention blocks, scan unroll), ``config`` (``ModelConfig`` and its checks)
and ``axes`` (the mesh axis names).  Nothing here imports the rest of the
package.
"""
