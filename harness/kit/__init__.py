"""The FSDP and DTensor kit: their test bases, models and parity helpers."""
