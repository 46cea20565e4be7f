"""The package's version (pyproject.toml's ``version`` says the same)."""
__version__ = "0.2.0"
