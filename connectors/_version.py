"""The package's version, read by ``pyproject.toml`` and ``eos --version``."""

__version__ = "0.2.0"
