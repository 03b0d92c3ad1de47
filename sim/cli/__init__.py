"""One module per python -m sim command, named as the command."""
