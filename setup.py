"""For tools that still call setup.py: the package is defined in pyproject.toml."""

from setuptools import setup

setup()
