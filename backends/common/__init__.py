"""The Ray world both real backends run, by role: run/ (the run command) over world/ (cells,
engines, router, transport) over engine/ (the SGLang-shaped server) over training/, wire/,
sglang/ and session/, with stack.py naming what the hardware decides."""
