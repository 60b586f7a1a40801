"""Ranks as processes: the test cases, the supervisor in the parent, the rank side, the
forkserver that starts ranks in milliseconds, shared-process classes and torchrun."""
