"""Transfer backends: move a batch of files between a remote location and the site."""
