"""What every launch mode shares: the rank's report, the rules that merge ranks' reports into
one outcome, and the collective trace shown for a hang."""
