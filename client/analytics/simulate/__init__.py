"""The what-if simulator (``lode analytics simulate``): see :mod:`.whatif`."""
