"""Decisions: ratio checks between strategies, probe checks, the baseline store and the baseline gate."""
