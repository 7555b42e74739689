"""Decisions: the decision core, ratio checks between strategies, probe checks, the baseline gate and head
against base."""
