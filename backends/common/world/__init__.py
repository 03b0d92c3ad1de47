"""The Ray world behind miles_core/backend.py: the asyncio runtime, trainer cells and engine
slots as Ray actors, the router, the weight transports and the fault actions."""
