"""What a test asks of the machine, and the skips when it is not there: upstream's skip codes
(skip_codes.py, plain data without torch), the requirement decorators and the one rule "are the
accelerators enough here, or may the CPU stand in" (decorators.py), upstream's platform
decorators (platform.py) and flags (flags.py), and how many ranks a test runs with
(world_size.py)."""
