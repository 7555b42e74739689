"""What outlives a session: baselines, the history database, atomic JSON files, checked output paths."""
