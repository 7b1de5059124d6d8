"""The command line, on top of the library (nothing in the library imports it).

``modes`` (``main``: the flags of ``transformer_xl/main.py`` into a
``Request``; ``run``: the checks, then the mode; ``--mode=train``),
``eval_modes`` (``--mode=eval`` and ``--mode=score``), ``generate_mode``
(``--mode=generate``), ``dynamic_modes`` (dynamic evaluation in eval and
score), ``user_errors`` (every user error as one ``error: ...`` line; the
``--tokens``, ``--text`` and ``--out`` files), ``saved_config`` (a
workdir's config.json as the ``--config`` of ``--config.*`` overrides
without one) and ``process_settings`` (the only code that changes
process-wide state: logging filters, signal handlers, the huge-page
restart).  The entry point is ``transformer_xl/main.py``.
"""
