"""What a session shows: the terminal tables and the report files (JSON, JUnit, Markdown, benchmark export)."""
