"""The mesh axis names and the logical-axis rules of the model's arrays.

Mesh axes: ``data`` (data parallel), ``fsdp`` (data parallel whose devices
also split the parameters and optimizer state, ZeRO-3 style) and ``model``
(tensor parallel).  The model's parameters carry logical axis names (set
where they are created, e.g. ``("embed", None, "heads", "kv")`` for
qkv_net); ``LOGICAL_AXIS_RULES`` maps them to mesh axes: heads, d_inner
("mlp") and the vocabulary on ``model``, d_model ("embed") on ``fsdp``; the
batch (and so the memory) on ``data`` x ``fsdp`` (MaxText style).
``transformer_xl.sharding`` builds meshes and shardings from these names.
"""

BATCH_AXES = ("data", "fsdp")  # the mesh axes that split the batch (rows)

LOGICAL_AXIS_RULES = (
    ("batch", BATCH_AXES),
    ("heads", "model"),
    ("mlp", "model"),
    ("vocab", "model"),
    ("embed", "fsdp"),
    ("kv", None),
    ("layers", None),
    ("length", None),
)
