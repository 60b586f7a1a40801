"""What every launch mode shares, below both the process and the thread modes: the Launcher
interface (launcher.py) and the case base that uses it (case.py), the context a rank's case
is handed (context.py), and ranks run in this very process (in_process.py: torchrun,
simulated ranks). What a rank reports and how ranks merge into a test's outcome is the
outcome model, one layer below (harness/outcome/)."""
