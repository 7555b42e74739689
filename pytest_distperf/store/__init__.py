"""What outlives a session: baselines, the history database, checked output paths, redaction, the report format."""
