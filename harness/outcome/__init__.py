"""The outcome model: what a rank reports about a test, and how that becomes the test's one
report. Plain Python and unittest, no torch and no launch mode, so every mode and every
reporter builds on it: rank_record.py (a rank's `Event`s and its `RankRecord`), report.py
(`TestReport`, the one record of a test's outcome, and its JSON form), merge.py (`decide`:
every rank's record merged by docs/design.md's rules into the TestReport), fold.py (the grid-point
fold rule, the reports of plain tests built from unittest's events, the result mixin every
runner result builds on), replay.py (a TestReport reported through unittest's API, for plain
runners), stacks.py and collective_trace.py (how a rank's stack and collectives are shown)."""
