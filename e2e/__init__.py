"""Browser tests: the dashboard in real Chromium, over real processes."""
