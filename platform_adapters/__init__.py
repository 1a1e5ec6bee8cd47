"""Platform adapters: compute nodes, node packing and app launchers used by the pilot launcher.

One small interface per adapter family (``compute.base``, ``launchers.base``), one module per
backend, and a fake for each family that passes the same shared test suite as the real ones.
"""
