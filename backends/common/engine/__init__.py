"""The SGLang-shaped engine server: one Ray actor serving SGLang's HTTP worker API, its states,
request checks, generation, KV and prefix caches, weight updates and reports."""
