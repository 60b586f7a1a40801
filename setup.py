"""Installs the `harness` package (the suites in test_cases/ run from a checkout)."""

from setuptools import find_packages, setup

setup(
    name="torch-dist-harness",
    version="0.1.0",
    description="A unittest-based multi-rank test harness for PyTorch, with FSDP suites.",
    python_requires=">=3.9",
    packages=find_packages(include=["harness", "harness.*"]),
    install_requires=[
        "torch>=2.4",
        "numpy>=1.24",  # torch's object collectives need it; the torch wheel does not require it
        "expecttest>=0.2",
        "unittest-xml-reporting>=3.2",
    ],
    # pytest loads the harness's plugin in any project that installs the package.
    entry_points={"pytest11": ["harness.pytest_plugin = harness.pytest_plugin"]},
)
