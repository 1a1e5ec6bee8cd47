"""Example app files, as a site author writes them: copy one into the site's ``apps/``."""
