"""Analyses of trained models (Dai et al. 2019, Sec. 4.3-4.5, Appendices C-D).

  attention.py   attention maps by relative distance, one query's context,
                 the decomposition of Sec. 3.3 (App. D, Figs. 5-7)
"""
