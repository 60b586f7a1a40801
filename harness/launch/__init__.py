"""What every launch mode shares, below both the process and the thread modes: the Job a
launcher runs (job.py), the Launcher interface (launcher.py), the unittest case base that
builds its job and uses a launcher (ranked_case.py), the context a rank's instance is handed
(context.py), the rank hooks a launcher calls on it (hooks.py), the fail-fast rule
(fail_fast.py), and ranks run in this very process (in_process.py: torchrun, simulated
ranks). What a rank reports and how ranks merge into a test's outcome is the outcome model,
one layer below (harness/outcome/)."""
