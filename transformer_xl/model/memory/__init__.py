"""The model's memory: one package, the only place that knows it.

Transformer-XL's recurrence memory (Dai et al. 2019, Sec. 3.2) and its
successors, as explicit state: a ``Memory`` goes into every call of the
model and the next ``Memory`` comes out.  Everything else of the package
imports this package (``from transformer_xl.model import memory``) and goes
through the names below; nothing outside it names a memory variant.

* ``state.py``: the ``Memory`` pytree (the XL cache and its counts, which
  every memory shares, and the variants' own arrays), its reset, the
  layer's read and update, the key layout, row maps and shardings;
* ``variant.py``: ``MemoryVariant``, the interface a memory variant
  implements (its settings, state, hooks into the model and what the rest
  of the package asks of it), ``register`` and the XL memory (its defaults);
* ``settings.py``: the variants' settings in the model and eval configs
  (``model.<name>``, ``eval.<name>``) and their checks;
* ``composition.py``: a model's memory (``plan``: the variants on and their hooks
  in order), ``init_memory`` and ``shardings``;
* ``compressive.py``: the compressive memory (Rae et al. 2020),
  ``model.memory="compressive"``;
* ``knn.py``: the kNN memory of Memorizing Transformers (Wu et al. 2022),
  ``model.memory="knn"``: its store and reads as pure functions exact to
  the authors' code, and the variant;
* ``tokens.py``: the memory tokens of the Recurrent Memory Transformer
  (Bulatov et al. 2022), ``model.tokens.num_mem_tokens`` > 0, beside any of
  them.

A new memory variant is a module here with a ``register``-ed subclass of
``MemoryVariant`` and one import line below (docs: "Write your own memory").
"""

from __future__ import annotations

from transformer_xl.model.memory import armt as armt
from transformer_xl.model.memory import composition as composition
from transformer_xl.model.memory import compressive as compressive
from transformer_xl.model.memory import knn as knn
from transformer_xl.model.memory import settings as settings
from transformer_xl.model.memory import state as state
from transformer_xl.model.memory import tokens as tokens
from transformer_xl.model.memory import variant as variant
from transformer_xl.model.memory.composition import LayerHooks as LayerHooks
from transformer_xl.model.memory.composition import Plan as Plan
from transformer_xl.model.memory.composition import abstract_memory as abstract_memory
from transformer_xl.model.memory.composition import describe_eval as describe_eval
from transformer_xl.model.memory.composition import eval_settings as eval_settings
from transformer_xl.model.memory.composition import eval_without as eval_without
from transformer_xl.model.memory.composition import init_memory as init_memory
from transformer_xl.model.memory.composition import plan as plan
from transformer_xl.model.memory.composition import replicated_shardings as replicated_shardings
from transformer_xl.model.memory.composition import shardings as shardings
from transformer_xl.model.memory.settings import config_problems as config_problems
from transformer_xl.model.memory.settings import default_sections as default_sections
from transformer_xl.model.memory.settings import eval_override_sections as eval_override_sections
from transformer_xl.model.memory.settings import eval_problems as eval_problems
from transformer_xl.model.memory.settings import normalise_settings as normalise_settings
from transformer_xl.model.memory.settings import renamed as renamed
from transformer_xl.model.memory.settings import run_problems as run_problems
from transformer_xl.model.memory.settings import sections as sections
from transformer_xl.model.memory.settings import tuple_settings as tuple_settings
from transformer_xl.model.memory.settings import upgrade_eval as upgrade_eval
from transformer_xl.model.memory.settings import upgrade_fields as upgrade_fields
from transformer_xl.model.memory.settings import without_defaults as without_defaults
from transformer_xl.model.memory.state import DOC_POS as DOC_POS
from transformer_xl.model.memory.state import Leaf as Leaf
from transformer_xl.model.memory.state import Memory as Memory
from transformer_xl.model.memory.state import advance_mlen as advance_mlen
from transformer_xl.model.memory.state import layer_read as layer_read
from transformer_xl.model.memory.state import layer_update as layer_update
from transformer_xl.model.memory.variant import VARIANTS as VARIANTS
from transformer_xl.model.memory.variant import MemoryVariant as MemoryVariant
from transformer_xl.model.memory.variant import register as register
