"""The outcome model: what a rank reports about a test, and how that becomes the test's one
outcome. Plain Python and unittest, no torch and no launch mode, so every mode and every
reporter builds on it: rank_record.py (a rank's `Event`s and its `RankRecord`), merge.py
(`decide`: every rank's record merged by DESIGN.md's rules), stacks.py and
collective_trace.py (how a rank's stack and collectives are shown in a report)."""
