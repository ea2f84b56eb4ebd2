"""Local, content-addressed copies of model weights: the one way weights reach a runner.

    model = ensure(source, settings.weights_dir)   # LocalModel: an HF-layout directory
    verify(model, full=True)                       # re-hash; WeightsCorrupt on mismatch

Importing this package is cheap (no torch, no transformers): the frontdoor uses
`parse_source` to validate deployments.
"""

from ebb.weights_cache.cache import LocalModel, ensure, verify
from ebb.weights_cache.sources import (
    ACCEPTED_FORMS,
    FakeSource,
    GgufSource,
    LocalDirSource,
    Source,
    SourceKind,
    parse_source,
)

__all__ = [
    "ACCEPTED_FORMS",
    "FakeSource",
    "GgufSource",
    "LocalDirSource",
    "LocalModel",
    "Source",
    "SourceKind",
    "ensure",
    "parse_source",
    "verify",
]
