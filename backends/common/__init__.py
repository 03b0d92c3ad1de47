"""The Ray layer shared by the CPU and GPU backends: asyncio runtime, Ray session, placement."""
