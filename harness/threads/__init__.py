"""Ranks as threads of one process: the test case, its in-process `threaded` backend and the
world the rank threads share."""
