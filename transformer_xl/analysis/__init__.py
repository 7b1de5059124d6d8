"""Analyses of trained models (Dai et al. 2019, Sec. 4.3-4.5, Appendices C-D).

attention/         attention maps by relative distance, one query's context,
                   the decomposition of Sec. 3.3 (App. D, Figs. 5-7);
                   python -m transformer_xl.analysis.attention
recl/              relative effective context length (Sec. 4.3, App. C,
                   Table 8, Figs. 3-4); python -m transformer_xl.analysis.recl
relative_gain.py   Appendix C's definitions (C.2-C.6) as numpy functions

Each command is a package of one role per module: ``__init__.py`` the
computation (callable from Python), ``plots.py`` the figures (matplotlib),
``__main__.py`` the command line (absl flags, as ``transformer_xl.main``).
"""
