"""Local, content-addressed copies of model weights: the one way weights reach a runner.

    options = CacheOptions.from_settings(settings)
    model = ensure(source, settings.weights_dir, options=options, hold=True)  # LocalModel
    verify(model, full=True)           # re-hash everything; WeightsCorrupt on mismatch
    release(model)                     # or exit: the entry may be evicted again
    cache_report(settings.weights_dir, options.budget_bytes)   # entries, usage, evictions

Importing this package is cheap (no torch, transformers, boto3 or huggingface_hub): the
frontdoor uses `parse_source` to validate deployments.
"""

from ebb.weights_cache.cache import LocalModel, cached_manifest, ensure, release, verify
from ebb.weights_cache.eviction import CacheReport, cache_report
from ebb.weights_cache.options import CacheOptions
from ebb.weights_cache.sources import (
    ACCEPTED_FORMS,
    GgufSource,
    HfSource,
    LocalDirSource,
    S3Source,
    Source,
    SourceKind,
    parse_source,
)

__all__ = [
    "ACCEPTED_FORMS",
    "CacheOptions",
    "CacheReport",
    "GgufSource",
    "HfSource",
    "LocalDirSource",
    "LocalModel",
    "S3Source",
    "Source",
    "SourceKind",
    "cache_report",
    "cached_manifest",
    "ensure",
    "parse_source",
    "release",
    "verify",
]
