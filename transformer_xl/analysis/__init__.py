"""The paper's analyses as tools (Dai et al. 2019, Sec. 4.3-4.5, Appendices C-E).

``recl.py``: relative effective context length (Sec. 4.3, Appendix C,
Table 8, Figures 3 and 4), ``python -m transformer_xl.analysis.recl``;
``relative_gain.py``: Appendix C's definitions (C.2-C.6) as numpy functions.
"""
