"""Ranks as threads of one process: the test case, its launcher, the in-process `threaded`
backend and the world the rank threads share."""
