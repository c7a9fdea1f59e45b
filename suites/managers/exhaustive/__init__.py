"""The bounded exhaustive explorer of the managers (issue 39): configurations, alphabet, oracle, search, replay."""
