"""The steps of a heteroflow pipeline and the resource model they declare.

Each step is a plain Python function that does the work (``prewarm``, ``preprocess``, ``plan``, ``train``,
``evaluate``, ``archive``); :mod:`heteroflow.components.kfp_components` wraps them as KFP components.
Importing this package is cheap: torch and kfp are imported only by the functions that need them.
"""
