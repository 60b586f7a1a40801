"""Ranks as processes: the test cases, their launchers (fresh processes per test, shared
processes per class, torchrun's), the supervisor in the parent, the rank side, and the
forkserver that starts ranks in milliseconds."""
