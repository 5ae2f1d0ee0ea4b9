"""Dataset caching: the cache tier next to the accelerators.

- :mod:`~heteroflow.cache.listing`: which files a data set holds (the one listing: local folders and fsspec URLs).
- :mod:`~heteroflow.cache.layout`: the folder of one data set in the cache tier (versions, staging, lock, its journal;
  ``cache_key``, ``dataset_cache_dir``) and its housekeeping.
- :mod:`~heteroflow.cache.prewarm`: copy a data set into the local cache tier as a trusted, immutable version
  (``prewarm``, the step function ``prewarm_dataset``, the up-front ``check_source``).
- :mod:`~heteroflow.cache.copying`: the file copy of a prewarm (hashing while copying, the thread pool, the journal).
- :mod:`~heteroflow.cache.backends`: the cache tiers: a local directory, Alluxio 2.x (REST proxy) and 3.x (alluxiofs).
- :mod:`~heteroflow.cache.manifest`: the manifest (path, bytes, sha256 per file; version; data set sha256).
- :mod:`~heteroflow.cache.dataset`: ``open_dataset``, the reader that checks what it reads against the manifest.
- :mod:`~heteroflow.cache.status`: what the cache holds (``heteroflow cache status``).
- :mod:`~heteroflow.cache.fluid`: Fluid Dataset / AlluxioRuntime / DataLoad manifests and data-locality affinity.
- :mod:`~heteroflow.cache.redact`: credentials in URLs, removed from everything heteroflow writes or prints.
- :mod:`~heteroflow.cache.sources`, :mod:`~heteroflow.cache.errors`, :mod:`~heteroflow.cache.atomic`,
  :mod:`~heteroflow.cache.progress`.
- :mod:`~heteroflow.cache.crds`: the CRDs heteroflow emits manifests for (files in ``data/crds/``) and validation.
"""
