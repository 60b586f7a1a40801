"""What every launch mode shares, below both the process and the thread modes: the Launcher
interface (launcher.py) and the case base that uses it (case.py), the context a rank's case
is handed (context.py), the rank's report and its serializable record (report.py), the one
merge of ranks' records into a test's outcome (verdict.py), ranks run in this very process
(in_process.py: torchrun, simulated ranks), and the collective trace shown for a hang."""
