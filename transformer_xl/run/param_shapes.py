"""The model's parameters on a mesh, without allocating them: shapes and shardings.

What a checkpoint's parameters are restored into (``run_dir.restore_params``)
and what the training state places its parameters by
(``training.train_state.abstract_train_state``).  No optimizer is involved:
readers of a checkpoint (evaluation, scoring, generation, the analyses)
need neither optax nor the training code.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
from jax.sharding import Mesh

from transformer_xl import sharding
from transformer_xl.model import models


def abstract_params(model: models.TransformerXL, mesh: Mesh):
  """Shapes and shardings of the parameters alone (no optimizer, nothing
  allocated): each placed by its logical axis names (sharding.py).

  Returns:
    (parameters as jax.ShapeDtypeStruct with shardings, their NamedShardings).
  """
  boxed_params = jax.eval_shape(functools.partial(models.init_params, model), jax.random.PRNGKey(0))
  shardings = sharding.logical_shardings(boxed_params, mesh)
  abstract = jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      nn.unbox(boxed_params),
      shardings,
  )
  return abstract, shardings
