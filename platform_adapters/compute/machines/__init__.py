"""Machine descriptions shipped with lodestream, one YAML file per machine (see ``machine.py``)."""
