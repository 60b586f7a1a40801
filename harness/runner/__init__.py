"""Running tests and reporting them: run_tests(), run_all.py's CLI and engine, the loader,
one record per test, progress, and JUnit XML."""
