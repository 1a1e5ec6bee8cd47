"""The site agent: hosts the site's apps and runs their jobs (ARCHITECTURE.md §5)."""
