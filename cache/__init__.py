"""Dataset caching: copy a data set into a cache tier next to the accelerators (prewarm) and describe it
with a manifest (relative path, size in bytes, sha256 of each file).

The cache tier is a local directory by default; any fsspec URL can be the source.
"""
