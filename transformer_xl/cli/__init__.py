"""The command line, on top of the library (nothing in the library imports it).

``modes`` (train, eval, score and generate as ``main`` runs them),
``dynamic_modes`` (dynamic evaluation in eval and score),
``user_errors`` (every user error as one ``error: ...`` line),
``saved_config`` (a workdir's config.json as the ``--config`` of
``--config.*`` overrides without one) and ``process_settings`` (the only
code that changes process-wide state: logging filters, signal handlers,
the huge-page restart).  The entry point is ``transformer_xl/main.py``.
"""
