"""Test-only memory variants, registered on import (one line each).

Each is a module of its own written against ``transformer_xl.model.memory``
alone; importing this package registers them all, and the conformance suite
(tests/test_memory_conformance.py) then runs every registered variant, these
included.  A new test variant is one file here plus its import line below.
"""

from memory_variants import gated as gated  # noqa: F401  (registers "gated_test")
from memory_variants import pooled as pooled  # noqa: F401  (registers "pooled_test")
