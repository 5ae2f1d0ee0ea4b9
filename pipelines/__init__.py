"""Composition of steps into pipelines, KFP rendering, local runs and the ``heteroflow`` command line."""
