"""The site agent: hosts the site's apps and runs their jobs (docs/architecture.md §9)."""
