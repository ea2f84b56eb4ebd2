"""Local directories already in Hugging Face layout: validated and served in place."""

from __future__ import annotations

from pathlib import Path

from ebb.errors import WeightsNotFound
from ebb.weights_cache.backend import Version
from ebb.weights_cache.manifest import Progress
from ebb.weights_cache.sources import LocalDirSource


class LocalDirBackend:
    """Backend for local directories. The store keeps only a manifest for them: copying a
    checkpoint that is already on local disk would double its footprint for nothing."""

    in_place = True
    resumable = False

    def resolve(self, source: LocalDirSource) -> Version:
        self.root(source)
        # The version is tracked by the manifest (sizes and mtimes), not by the key: the
        # directory's contents can change under the same path.
        return Version("")

    def root(self, source: LocalDirSource) -> Path:
        path = Path(source.path)
        if not path.exists():
            raise WeightsNotFound(
                f"model directory {path} does not exist (source {source.uri}); "
                "point the source at a directory holding config.json and *.safetensors"
            )
        if not path.is_dir():
            raise WeightsNotFound(
                f"{path} is a file, not a model directory (source {source.uri}); "
                "for a single GGUF file use gguf:/abs/path/file.gguf"
            )
        return path

    def fetch(
        self, source: LocalDirSource, version: Version, dest: Path, progress: Progress | None
    ) -> None:
        raise NotImplementedError("local directories are used in place")
