"""Apps the chaos site defines (copied into its site directory)."""
